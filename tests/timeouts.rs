//! Spec §7: a per-reconcile timeout cancels the reconcile cooperatively at
//! its deadline; whatever it returns then counts as a failure
//! (`TimeoutError`) retried with the rate limiter, and is counted in
//! `controller_runtime_reconcile_timeouts_total`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;

use common::*;
use parking_lot::Mutex;
use reconq::*;

/// Whether each reconcile's context said it was cancelled, in order.
type CancelledSeen = Arc<Mutex<Vec<bool>>>;

/// A fake-clock controller with a 5 s timeout whose first reconcile of each
/// key reports entering (with its cancel signal), then waits on its context
/// (or, `ignoring`, on a gate the test opens) and returns Ok.
fn timed(
    name: &str,
    ignoring: bool,
    clock: &FakeClock,
) -> (ControllerHandle<String>, mpsc::Receiver<StopSignal>, mpsc::Sender<()>, CancelledSeen) {
    let (entered_tx, entered) = mpsc::channel();
    let (release, gate) = mpsc::channel::<()>();
    let (entered_tx, gate) = (Mutex::new(entered_tx), Mutex::new(gate));
    let cancelled_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&cancelled_seen);
    let h = Controller::new(name, move |_: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        if ctx.attempt() == 0 {
            entered_tx.lock().send(ctx.cancel_signal().clone()).unwrap();
            if ignoring {
                gate.lock().recv_timeout(PATIENCE).unwrap();
            } else {
                ctx.wait_cancelled(PATIENCE);
            }
        }
        seen.lock().push(ctx.is_cancelled());
        Ok(Action::Done)
    })
    .clock(clock.clone())
    .rate_limiter(ExponentialBackoff::new(secs(1), secs(100)))
    .timeout(secs(5))
    .start();
    (h, entered, release, cancelled_seen)
}

#[test]
fn a_reconcile_past_its_timeout_is_cancelled_and_retried_as_a_failure() {
    let clock = FakeClock::new();
    let (h, entered, _release, seen) = timed("timeout_coop", false, &clock);
    h.enqueue("k".to_string());
    expect_within(&entered, "reconcile entered");
    clock.advance(secs(4));
    assert_eq!(h.stats().failures, 0, "not yet");
    clock.advance(secs(1)); // the deadline: the watchdog cancels it
    wait_for("the retry is scheduled", || matches!(h.inspect(&"k".to_string()).state, KeyStatus::Waiting { .. }));
    let s = h.stats();
    assert_eq!((s.reconciles, s.successes, s.failures), (1, 0, 1), "returned Ok, counted as a failure");
    assert_eq!(s.last_error.as_deref(), Some("TimeoutError: reconcile timed out after 5 s"));
    let info = h.inspect(&"k".to_string());
    assert_eq!(info.attempts, 1);
    assert_eq!(info.next_run, Some(clock.now() + secs(1)), "retried with the rate limiter's back-off");
    clock.advance(secs(1));
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(*seen.lock(), [true, false], "cancelled the first time only");
    assert_eq!(h.stats().successes, 1);
    let text = reconq::metrics::render();
    assert!(
        text.contains(r#"controller_runtime_reconcile_timeouts_total{controller="timeout_coop"} 1"#),
        "timeouts metric:\n{text}"
    );
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn a_reconcile_that_ignores_its_context_runs_to_its_end_and_still_fails() {
    let clock = FakeClock::new();
    let (h, entered, release, seen) = timed("timeout_ignored", true, &clock);
    h.enqueue("k".to_string());
    let signal = expect_within(&entered, "reconcile entered");
    clock.advance(secs(6));
    assert!(signal.wait_timeout(PATIENCE), "cancelled at the deadline");
    // Nothing is killed: the reconcile is still running until it returns.
    assert_eq!(h.stats().processing, 1);
    assert_eq!(h.stats().failures, 0);
    release.send(()).unwrap();
    wait_for("the retry is scheduled", || h.stats().failures == 1);
    assert!(h.stats().last_error.unwrap().starts_with("TimeoutError: "));
    assert!(seen.lock()[0], "its context said so");
    clock.advance(secs(1));
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn a_reconcile_that_finishes_in_time_is_not_affected() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let h = Controller::new("timeout_fast", move |_: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        c.fetch_add(1, Ordering::SeqCst);
        assert!(!ctx.is_cancelled());
        Ok(Action::Done)
    })
    .workers(2)
    .timeout(secs(60))
    .start();
    for k in 0..200 {
        h.enqueue(k);
    }
    assert!(h.wait_idle(PATIENCE));
    let s = h.stats();
    assert_eq!((s.successes, s.failures), (200, 0));
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn the_timeout_and_the_hang_report_share_the_watchdog() {
    // A short timeout with a long hanging threshold: a reconcile that
    // starts while another (timed out, ignoring it) still runs must still
    // be cancelled at its own deadline.
    let clock = FakeClock::new();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let h = Controller::new("timeout_hang", move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        if ctx.attempt() > 0 {
            return Ok(Action::Done);
        }
        if key == "stuck" {
            gate.lock().recv_timeout(PATIENCE).unwrap();
        } else {
            ctx.wait_cancelled(PATIENCE);
        }
        Ok(Action::Done)
    })
    .clock(clock.clone())
    .workers(2)
    .timeout(secs(1))
    .hanging_threshold(secs(100))
    .start();
    h.enqueue("stuck".to_string());
    wait_for("stuck runs", || h.stats().processing == 1);
    clock.advance(secs(2)); // stuck timed out, still running
    h.enqueue("later".to_string());
    wait_for("later runs", || h.stats().processing == 2);
    clock.advance(secs(1));
    wait_for("later cancelled at its deadline", || h.stats().failures == 1);
    release.send(()).unwrap();
    wait_for("stuck returned", || h.stats().failures == 2);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
#[should_panic(expected = "a reconcile timeout must be positive")]
fn a_zero_timeout_is_refused() {
    let _ = Controller::new("zero", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .timeout(std::time::Duration::ZERO);
}
