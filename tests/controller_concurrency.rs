//! Multi-worker behaviour: per-key exclusivity, a reconcile enqueueing on
//! its own controller, hang reports, and the thread wrapper.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use common::*;
use crossbeam_channel::unbounded;
use parking_lot::Mutex;
use reconq::*;

type Res = Result<Action, ReconcileError>;

#[test]
fn a_key_never_runs_on_two_workers_at_once() {
    const KEYS: u32 = 16;
    const ROUNDS: usize = 30;
    let active: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let handle: Arc<OnceLock<ControllerHandle<u32>>> = Arc::new(OnceLock::new());
    let (a, r, o, hh) = (active.clone(), runs.clone(), overlaps.clone(), handle.clone());
    let controller = Controller::new("g2", move |k: &u32, _: &Context| -> Res {
        let i = *k as usize;
        if a[i].fetch_add(1, Ordering::SeqCst) != 0 {
            o.fetch_add(1, Ordering::SeqCst);
        }
        // Re-add while running: dirty, must wait for done (G2, G3).
        if r[i].fetch_add(1, Ordering::SeqCst) + 1 < ROUNDS {
            hh.get().unwrap().enqueue(*k);
        }
        for _ in 0..100 {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
        a[i].fetch_sub(1, Ordering::SeqCst);
        Ok(Action::Done)
    })
    .workers(4);
    handle.set(controller.handle()).unwrap();
    let h = controller.start();
    for _ in 0..3 {
        for k in 0..KEYS {
            h.enqueue(k);
        }
    }
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    for r in runs.iter() {
        assert_eq!(r.load(Ordering::SeqCst), ROUNDS);
    }
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn a_reconcile_can_enqueue_on_its_own_controller() {
    let handle: Arc<OnceLock<ControllerHandle<String>>> = Arc::new(OnceLock::new());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (hh, c) = (handle.clone(), calls.clone());
    let controller = Controller::new("self", move |k: &String, _: &Context| -> Res {
        let first = {
            let mut calls = c.lock();
            calls.push(k.clone());
            calls.len() == 1
        };
        let h = hh.get().unwrap();
        if first {
            h.enqueue("child".to_string());
            h.enqueue(k.clone()); // itself: runs once more after done
            let _ = (h.stats(), h.inspect(k), h.hanging());
        }
        Ok(Action::Done)
    });
    handle.set(controller.handle()).unwrap();
    let h = controller.start();
    h.enqueue("parent".to_string());
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(*calls.lock(), ["parent", "child", "parent"]);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn hanging_reconciles_are_reported_on_the_controller_clock() {
    let clock = FakeClock::new();
    let (release_tx, release_rx) = unbounded::<()>();
    let h = Controller::new("hangs", move |k: &String, _: &Context| -> Res {
        if k == "slow" {
            release_rx.recv().unwrap();
        }
        Ok(Action::Done)
    })
    .workers(2)
    .clock(clock.clone())
    .hanging_threshold(secs(10))
    .start();
    assert_eq!(h.background_threads(), 1, "the watchdog");
    h.enqueue("slow".to_string());
    wait_for("slow running", || matches!(h.inspect(&"slow".to_string()).state, KeyStatus::Running { .. }));
    assert!(h.hanging().is_empty());
    clock.advance(secs(11));
    assert_eq!(h.hanging(), [("slow".to_string(), secs(11))]);
    assert_eq!(h.stats().hanging, 1);
    h.enqueue("fast".to_string());
    wait_for("fast done", || h.stats().successes == 1);
    assert_eq!(h.hanging().len(), 1);
    release_tx.send(()).unwrap();
    assert!(h.wait_idle(PATIENCE));
    assert!(h.hanging().is_empty());
    assert_eq!(h.stats().hanging, 0);
    assert!(h.stop_with_drain(PATIENCE));
    assert_eq!(h.background_threads(), 0, "the watchdog exited");
}

#[test]
fn threads_are_named_and_run_inside_the_wrapper() {
    let names = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let n = names.clone();
    let wrapper: ThreadWrapper = Arc::new(move |body: &mut dyn FnMut()| {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        *n.lock().entry(name).or_default() += 1;
        body();
    });
    let ran_on = Arc::new(Mutex::new(Vec::new()));
    let r = ran_on.clone();
    let h = Controller::new("wrapped", move |_k: &u32, _: &Context| -> Res {
        r.lock().push(std::thread::current().name().unwrap().to_string());
        Ok(Action::Done)
    })
    .workers(2)
    .thread_wrapper(wrapper)
    .start();
    h.add_trigger(1, |_: &StopSignal| ());
    wait_for("trigger ran", || !ran_on.lock().is_empty());
    assert!(h.stop_with_drain(PATIENCE));
    assert!(h.join_timeout(PATIENCE));
    let names = names.lock().clone();
    assert_eq!(names.get("reconq-wrapped-0"), Some(&1));
    assert_eq!(names.get("reconq-wrapped-1"), Some(&1));
    assert_eq!(names.get("reconq-wrapped-trigger"), Some(&1));
    assert!(ran_on.lock()[0].starts_with("reconq-wrapped-"));
}
