//! Stopping: immediate stop, two-phase drain (including a reconcile that
//! never returns), cancel(&k), run(), handles before start, and the finality
//! of stats once wait_idle returns.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use common::*;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parking_lot::Mutex;
use reconq::*;

type Res = Result<Action, ReconcileError>;

fn running(h: &ControllerHandle<String>, k: &str) -> bool {
    matches!(h.inspect(&k.to_string()).state, KeyStatus::Running { .. })
}

#[test]
fn stop_drops_ready_and_delayed_keys_and_cancels_in_flight() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cancelled = Arc::new(AtomicBool::new(false));
    let (s, c) = (seen.clone(), cancelled.clone());
    let h = Controller::new("stop", move |k: &String, ctx: &Context| -> Res {
        s.lock().push(k.clone());
        if k == "slow" {
            c.store(ctx.wait_cancelled(PATIENCE), Ordering::SeqCst);
        }
        Ok(Action::Done)
    })
    .start();
    h.enqueue("slow".to_string());
    wait_for("slow running", || running(&h, "slow"));
    h.enqueue("ready".to_string());
    h.enqueue_after("delayed".to_string(), Duration::from_millis(1));
    let t = Instant::now();
    h.stop();
    assert!(t.elapsed() < Duration::from_secs(1), "stop returns at once");
    assert!(h.join_timeout(PATIENCE), "the worker exits after its reconcile");
    assert!(h.is_stopped());
    assert!(cancelled.load(Ordering::SeqCst), "the in-flight reconcile saw is_cancelled");
    assert_eq!(*seen.lock(), ["slow"], "ready and delayed keys were dropped");
    h.enqueue("late".to_string());
    assert_eq!(h.stats().depth, 0, "enqueue after stop is ignored");
    h.stop();
    assert!(h.stop_with_drain(PATIENCE), "stopping again is fine");
}

#[test]
fn drain_reconciles_ready_and_dirty_keys_without_cancelling() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (release_tx, release_rx): (Sender<()>, Receiver<()>) = bounded(0);
    let (s, rx) = (seen.clone(), release_rx.clone());
    let h = Controller::new("drain", move |k: &String, ctx: &Context| -> Res {
        if k == "slow" && s.lock().iter().all(|(k, _)| k != "slow") {
            rx.recv().unwrap();
        }
        s.lock().push((k.clone(), ctx.is_cancelled()));
        Ok(Action::Done)
    })
    .start();
    h.enqueue("slow".to_string());
    wait_for("slow running", || running(&h, "slow"));
    h.enqueue("slow".to_string()); // dirty: runs again after done
    h.enqueue("ready".to_string());
    h.enqueue_after("delayed".to_string(), Duration::from_secs(3600));
    let stopper = {
        let h = h.clone();
        std::thread::spawn(move || h.stop_with_drain_report(PATIENCE))
    };
    wait_for("drain started", || h.stats().waiting == 0);
    release_tx.send(()).unwrap();
    let report = stopper.join().unwrap();
    let dropped = vec!["delayed".to_string()];
    assert_eq!(
        report,
        StopReport {
            finished: true,
            unfinished: vec![],
            detached_threads: 0,
            unfinished_caches: vec![],
            dropped,
            store_error: None
        }
    );
    let seen = seen.lock().clone();
    assert_eq!(
        seen,
        [("slow".to_string(), false), ("ready".to_string(), false), ("slow".to_string(), false)],
        "ready and dirty keys drained, nothing cancelled, delayed dropped"
    );
    assert!(h.is_stopped());
    assert!(h.join_timeout(Duration::ZERO));
}

#[test]
fn drain_deadline_cancels_and_detaches_a_reconcile_that_never_returns() {
    let (_never_tx, never_rx) = unbounded::<()>();
    let cancelled_after = Arc::new(Mutex::new(None));
    let drain_start = Arc::new(Mutex::new(None::<Instant>));
    let (ca, ds) = (cancelled_after.clone(), drain_start.clone());
    let h = Controller::new("hang", move |k: &String, ctx: &Context| -> Res {
        if k == "stuck" {
            let _ = never_rx.recv(); // never returns: the sender lives on
        } else {
            ctx.cancel_signal().wait();
            let start = ds.lock().expect("drain started");
            *ca.lock() = Some(start.elapsed());
        }
        Ok(Action::Done)
    })
    .workers(2)
    .start();
    h.enqueue("stuck".to_string());
    h.enqueue("polite".to_string());
    wait_for("both running", || running(&h, "stuck") && running(&h, "polite"));
    let timeout = Duration::from_millis(300);
    *drain_start.lock() = Some(Instant::now());
    let t = Instant::now();
    let report = h.stop_with_drain_report(timeout);
    let took = t.elapsed();
    assert!(!report.finished);
    assert!(report.unfinished.contains(&"stuck".to_string()), "{report:?}");
    assert!(took >= timeout && took < timeout + Duration::from_secs(5), "returned by the deadline: {took:?}");
    wait_for("polite cancelled", || cancelled_after.lock().is_some());
    assert!(cancelled_after.lock().unwrap() >= timeout, "not cancelled before the deadline");
    assert!(h.is_stopped(), "the stuck worker is detached");
    assert!(!h.join_timeout(Duration::from_millis(10)), "it cannot be joined");
    std::mem::forget(_never_tx);
}

#[test]
fn cancel_targets_the_running_key_only() {
    let (started_tx, started_rx) = unbounded::<u32>();
    let results = Arc::new(Mutex::new(Vec::new()));
    let r = results.clone();
    let h = Controller::new("cancel", move |_k: &String, ctx: &Context| -> Res {
        started_tx.send(ctx.attempt()).unwrap();
        let cancelled = ctx.wait_cancelled(if ctx.attempt() == 0 { PATIENCE } else { Duration::ZERO });
        r.lock().push(cancelled);
        if ctx.attempt() == 0 { Ok(Action::Requeue) } else { Ok(Action::Done) }
    })
    .rate_limiter(ExponentialBackoff::new(Duration::ZERO, Duration::ZERO))
    .start();
    assert!(!h.cancel(&"k".to_string()), "nothing running");
    h.enqueue("k".to_string());
    assert_eq!(started_rx.recv_timeout(PATIENCE).unwrap(), 0);
    assert!(!h.cancel(&"other".to_string()));
    assert!(h.cancel(&"k".to_string()));
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(*results.lock(), [true, false], "the next reconcile of k starts uncancelled");
    h.stop();
}

#[test]
fn stats_are_final_once_wait_idle_returns() {
    let h = Controller::new("final", |_k: &u64, _: &Context| -> Res { Ok(Action::Done) }).workers(4).start();
    let mut total = 0;
    for round in 0..20u64 {
        for k in 0..200 {
            h.enqueue(round * 1000 + k);
        }
        total += 200;
        assert!(h.wait_idle(PATIENCE));
        let s = h.stats();
        assert_eq!((s.reconciles, s.successes), (total, total));
        assert_eq!((s.depth, s.processing, s.waiting), (0, 0, 0));
    }
    assert!(h.stop_with_drain(PATIENCE));
}

/// Controller `name` (not started) whose reconciles succeed, counted.
fn counting(name: &str) -> (Controller<u32>, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let controller = Controller::new(name, move |_k: &u32, _: &Context| -> Res {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(Action::Done)
    });
    (controller, count)
}

#[test]
fn handle_before_start_keeps_enqueues_and_run_blocks_until_stopped() {
    let (controller, count) = counting("run");
    let controller = controller.workers(2);
    let h = controller.handle();
    assert_eq!((h.name(), h.workers()), ("run", 2));
    for k in 0..10 {
        h.enqueue(k);
    }
    h.enqueue_after(99, Duration::from_millis(1));
    assert_eq!(h.stats().depth, 11);
    assert_eq!(h.inspect(&3).state, KeyStatus::Ready);
    let runner = std::thread::spawn(move || controller.run());
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(count.load(Ordering::SeqCst), 11);
    assert!(!runner.is_finished());
    assert!(!h.join_timeout(Duration::from_millis(20)), "running: join times out");
    h.stop();
    runner.join().unwrap();
    assert!(h.is_stopped());
    assert!(h.join_timeout(Duration::ZERO));
}

#[test]
fn stop_before_start_means_nothing_runs_and_start_is_an_error() {
    let controller = Controller::new("never", |_k: &u32, _: &Context| -> Res { panic!("must not run") });
    let h = controller.handle();
    h.enqueue(1);
    h.stop();
    assert!(h.stop_with_drain(Duration::ZERO));
    let refused = controller.try_start().expect_err("a stopped controller cannot start");
    assert!(refused.to_string().contains("stopped through a handle before start"), "{refused}");
    assert!(h.is_stopped());
    assert!(h.wait_idle(Duration::ZERO));
    assert_eq!(h.stats(), Stats::default());
}

#[test]
#[should_panic(expected = "stopped through a handle before start")]
fn start_after_a_stop_panics() {
    let controller = Controller::new("stopped", |_k: &u32, _: &Context| -> Res { Ok(Action::Done) });
    controller.handle().stop();
    controller.start();
}

#[test]
fn dropping_handles_does_not_stop_the_controller() {
    let (controller, count) = counting("drop");
    let keep = controller.handle();
    drop(controller.start());
    keep.enqueue(1);
    assert!(keep.wait_idle(PATIENCE));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert!(keep.stop_with_drain(PATIENCE));
}

#[test]
fn a_drain_reports_the_keys_it_dropped_and_an_immediate_stop_drops_ready_ones_too() {
    let h = Controller::new("dropper", |k: &String, _: &Context| -> Res {
        if k == "failing" { Err(ReconcileError::new("down")) } else { Ok(Action::Done) }
    })
    .rate_limiter(ExponentialBackoff::new(Duration::from_secs(3600), Duration::from_secs(3600)))
    .start();
    h.enqueue("failing".to_string());
    h.enqueue_after("later".to_string(), Duration::from_secs(3600));
    wait_for("the failure's retry to be scheduled", || h.stats().waiting == 2);
    let mut report = h.stop_with_drain_report(PATIENCE);
    report.dropped.sort();
    assert!(report.finished);
    assert_eq!(report.dropped, ["failing", "later"], "a retry in back-off and a delayed key");
}

#[test]
fn waiting_for_itself_from_inside_a_reconcile_returns_false_at_once() {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let slot: Arc<OnceLock<ControllerHandle<u32>>> = Arc::new(OnceLock::new());
    let inner = Arc::clone(&slot);
    let c = Controller::new("self-waiter", move |_: &u32, _: &Context| -> Result<Action, ReconcileError> {
        let h = inner.get().expect("set before the key is enqueued");
        let answers = (h.on_own_worker(), h.wait_idle(Duration::from_secs(3600)), h.wait_stopped(None));
        tx.lock().send(answers).unwrap();
        Ok(Action::Done)
    });
    slot.set(c.handle()).ok();
    let h = c.start();
    h.enqueue(1);
    assert_eq!(expect_within(&rx, "the reconcile's waits return"), (true, false, false));
    assert!(!h.on_own_worker(), "the test thread is no worker");
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
}

/// `stop_with` requests the stop before it returns and its `wait` drives a
/// drain in slices: `None` while a reconcile runs, then the report (again
/// on a later call); `state()` says where the controller is all along.
#[test]
fn a_stop_with_options_is_waited_for_in_slices() {
    let (release_tx, release_rx): (Sender<()>, Receiver<()>) = bounded(0);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let controller = Controller::new("sliced", move |k: &String, _ctx: &Context| -> Res {
        if k == "slow" {
            release_rx.recv().unwrap();
        }
        s.lock().push(k.clone());
        Ok(Action::Done)
    });
    let h = controller.handle();
    assert_eq!(h.state(), status::RunState::NotStarted);
    controller.start();
    assert_eq!(h.state(), status::RunState::Running);
    h.enqueue("slow".to_string());
    wait_for("slow running", || running(&h, "slow"));
    h.enqueue("ready".to_string());
    h.enqueue_after("delayed".to_string(), Duration::from_secs(3600));
    let mut stopping = h.stop_with(StopOptions { drain: true, timeout: None, aux_grace: None });
    assert_eq!(h.state(), status::RunState::Stopping);
    assert!(stopping.wait(Duration::from_millis(20)).is_none(), "the slow reconcile still runs");
    release_tx.send(()).unwrap();
    let report = loop {
        if let Some(report) = stopping.wait(Duration::from_millis(20)) {
            break report;
        }
    };
    assert!(report.finished);
    assert_eq!(report.dropped, ["delayed"]);
    assert_eq!(*seen.lock(), ["slow", "ready"], "the drain reconciled the ready key");
    assert_eq!(h.state(), status::RunState::Stopped);
    assert_eq!(stopping.wait(Duration::ZERO), Some(report), "a done stop reports again");
}

/// A stop at once whose timeout passes while a reconcile ignores its
/// cancellation reports it unfinished, without detaching anything.
#[test]
fn a_stop_at_once_with_a_timeout_reports_unfinished() {
    let (release_tx, release_rx): (Sender<()>, Receiver<()>) = bounded(0);
    let h = Controller::new("at-once", move |_k: &String, _ctx: &Context| -> Res {
        release_rx.recv().unwrap();
        Ok(Action::Done)
    })
    .start();
    h.enqueue("stuck".to_string());
    wait_for("stuck running", || running(&h, "stuck"));
    let mut stopping = h.stop_with(StopOptions { drain: false, timeout: Some(Duration::ZERO), aux_grace: None });
    let report = stopping.wait(PATIENCE).expect("the timeout has passed");
    assert!(!report.finished);
    assert_eq!(h.state(), status::RunState::Stopping, "the worker still runs");
    release_tx.send(()).unwrap();
    assert!(h.join_timeout(PATIENCE));
    assert_eq!(h.state(), status::RunState::Stopped);
}

/// A source whose stop hook enqueues a key: the hook runs on the stopping
/// thread while the controller's stop hooks run (its watch lets the cache
/// go), after the stop was requested and before the queue shuts down.
struct EnqueuesAtItsStop {
    handle: ControllerHandle<String>,
    hooked: Arc<AtomicBool>,
    enqueued: Arc<AtomicBool>,
}

impl source::Source for EnqueuesAtItsStop {
    type Key = String;
    type Object = u64;
    type Position = u64;
    type Version = u64;

    fn list(&mut self, stop: &source::Stop) -> Result<source::Listing<String, u64, u64, u64>, source::SourceError> {
        let (handle, enqueued) = (self.handle.clone(), Arc::clone(&self.enqueued));
        // Kept for the cache's life: the hook runs when the stop is set.
        std::mem::forget(stop.on_set(move || {
            handle.enqueue("late".to_string());
            enqueued.store(true, Ordering::SeqCst);
        }));
        self.hooked.store(true, Ordering::SeqCst);
        Ok(source::Listing { items: Vec::new(), position: Some(0) })
    }

    fn changes(
        &mut self,
        _from: Option<&u64>,
        stop: &source::Stop,
    ) -> Result<source::Changes<'_, Self>, source::SourceError> {
        let stop = stop.clone();
        Ok(Box::new(std::iter::from_fn(move || {
            while !stop.wait_timeout(Duration::from_secs(1)) {}
            None
        })))
    }
}

/// An enqueue made once a stop was requested is ignored, also before the
/// queue shut down (here: from a hook the stop itself runs): the drain does
/// not reconcile it.
#[test]
fn an_enqueue_after_a_stop_was_requested_is_ignored_before_the_queue_shuts_down() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let controller = Controller::from_fn("late-enqueue", move |key: &String, _| -> Res {
        record.lock().push(key.clone());
        Ok(Action::Done)
    });
    let (hooked, enqueued) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let source =
        EnqueuesAtItsStop { handle: controller.handle(), hooked: Arc::clone(&hooked), enqueued: Arc::clone(&enqueued) };
    let cache = Cache::builder("late-enqueue", source).build().unwrap();
    let h = controller.watch_cache(&cache, Watch::new()).start();
    assert!(h.wait_synced(Some(PATIENCE)));
    assert!(hooked.load(Ordering::SeqCst));
    h.enqueue("early".to_string());
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    assert!(enqueued.load(Ordering::SeqCst), "the stop let the cache go, which ran the source's stop hook");
    assert_eq!(*seen.lock(), ["early"], "the key enqueued during the stop was not reconciled");
}
