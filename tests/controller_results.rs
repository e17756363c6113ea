//! Every row of the reconcile result table (guarantees §4), attempt numbers,
//! panics, the parked set and per-key inspection. Fake clock throughout:
//! retries only come back when the test moves time.

mod common;

use common::*;
use reconq::*;

fn key() -> String {
    "k".to_string()
}

/// Waits until the key is waiting for a due time, and returns it relative
/// to the clock's now.
/// A controller on a fake clock (see [`fake_controller`]) playing `steps`,
/// with [`key()`] enqueued; its script and clock.
fn play(steps: impl IntoIterator<Item = Step>) -> (ControllerHandle<String>, Script, FakeClock) {
    let clock = FakeClock::new();
    let script = Script::new(steps);
    let h = fake_controller(&script, &clock);
    h.enqueue(key());
    (h, script, clock)
}

fn waiting_for(h: &ControllerHandle<String>, clock: &FakeClock) -> std::time::Duration {
    let mut until = None;
    wait_for("key waiting", || match h.inspect(&key()).state {
        KeyStatus::Waiting { until: u } => {
            until = Some(u);
            true
        }
        _ => false,
    });
    until.unwrap() - clock.now()
}

#[test]
fn done_forgets_and_counts_a_success() {
    let (h, ..) = play([Step::Done]);
    assert!(h.wait_idle(PATIENCE));
    let s = h.stats();
    assert_eq!((s.reconciles, s.successes, s.failures, s.requeues), (1, 1, 0, 0));
    assert_eq!(s.last_error, None);
    let info = h.inspect(&key());
    assert_eq!(info.state, KeyStatus::Unknown);
    assert_eq!((info.attempts, info.next_run), (0, None));
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn requeue_is_rate_limited_and_counts_a_requeue() {
    let (h, script, clock) = play([Step::Requeue, Step::Requeue, Step::Done]);
    assert_eq!(waiting_for(&h, &clock), secs(1));
    let s = h.stats();
    assert_eq!((s.reconciles, s.successes, s.failures, s.requeues), (1, 0, 0, 1));
    assert_eq!(h.inspect(&key()).attempts, 1);
    clock.advance(secs(1));
    assert_eq!(waiting_for(&h, &clock), secs(2), "the limiter's count grows");
    clock.advance(secs(2));
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(script.attempts(), [0, 1, 2]);
    let s = h.stats();
    assert_eq!((s.reconciles, s.successes, s.failures, s.requeues), (3, 1, 0, 2));
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn requeue_after_forgets_and_adds_after_the_delay() {
    let (h, script, clock) = play([Step::Fail("boom"), Step::RequeueAfter(secs(5)), Step::Fail("again")]);
    assert_eq!(waiting_for(&h, &clock), secs(1));
    clock.advance(secs(1));
    wait_for("second call", || h.stats().reconciles == 2);
    assert_eq!(waiting_for(&h, &clock), secs(5));
    assert_eq!(h.inspect(&key()).attempts, 0, "RequeueAfter resets attempts");
    clock.advance(secs(5));
    wait_for("third call", || h.stats().reconciles == 3);
    // The limiter was forgotten: the next failure waits the base again.
    assert_eq!(waiting_for(&h, &clock), secs(1));
    assert_eq!(script.attempts(), [0, 1, 0]);
    let s = h.stats();
    // The resync counts as a success (work done), not as a requeue.
    assert_eq!((s.successes, s.failures, s.requeues), (1, 2, 0));
    h.stop();
}

#[test]
fn errors_retry_with_backoff_and_record_the_last_error() {
    let (h, script, clock) = play([Step::Fail("one"), Step::Fail("two"), Step::Done]);
    assert_eq!(waiting_for(&h, &clock), secs(1));
    let info = h.inspect(&key());
    assert_eq!((info.attempts, info.last_error.as_deref()), (1, Some("one")));
    assert_eq!(info.next_run, Some(clock.now() + secs(1)));
    let s = h.stats();
    assert_eq!((s.reconciles, s.failures, s.last_error.as_deref()), (1, 1, Some("one")));
    assert!(s.last_error_time.is_some());
    clock.advance(secs(1));
    wait_for("second call", || h.stats().reconciles == 2);
    assert_eq!(waiting_for(&h, &clock), secs(2));
    clock.advance(secs(2));
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(script.attempts(), [0, 1, 2]);
    let s = h.stats();
    assert_eq!((s.reconciles, s.successes, s.failures, s.requeues), (3, 1, 2, 0));
    let info = h.inspect(&key());
    assert_eq!((info.attempts, info.last_error), (0, None), "a success clears the key's memory");
    h.stop();
}

#[test]
fn retry_after_waits_exactly_and_keeps_the_limiter_history() {
    let (h, script, clock) = play([Step::Fail("a"), Step::RetryAfter(secs(3), "b"), Step::Fail("c")]);
    assert_eq!(waiting_for(&h, &clock), secs(1));
    clock.advance(secs(1));
    wait_for("second call", || h.stats().reconciles == 2);
    assert_eq!(waiting_for(&h, &clock), secs(3));
    assert_eq!(h.inspect(&key()).last_error.as_deref(), Some("b"));
    clock.advance(secs(3));
    wait_for("third call", || h.stats().reconciles == 3);
    // Not forgotten and not asked: the limiter saw one failure, so 2 s now.
    assert_eq!(waiting_for(&h, &clock), secs(2));
    assert_eq!(script.attempts(), [0, 1, 2]);
    assert_eq!(h.stats().failures, 3);
    h.stop();
}

#[test]
fn permanent_errors_park_the_key_without_retry() {
    let (h, script, clock) = play([Step::Fail("flaky"), Step::Permanent("bad spec"), Step::Done]);
    assert_eq!(waiting_for(&h, &clock), secs(1));
    clock.advance(secs(1));
    assert!(h.wait_idle(PATIENCE), "a permanent error schedules nothing");
    let s = h.stats();
    assert_eq!((s.reconciles, s.failures, s.parked), (2, 2, 1));
    assert_eq!(s.last_error.as_deref(), Some("bad spec"));
    assert_eq!(h.parked(), [key()]);
    let info = h.inspect(&key());
    assert_eq!(info.state, KeyStatus::Parked);
    assert_eq!((info.attempts, info.last_error.as_deref(), info.next_run), (0, Some("bad spec"), None));

    assert!(h.requeue_parked(&key()));
    assert!(!h.requeue_parked(&key()), "no longer parked");
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(script.attempts(), [0, 1, 0], "forgotten: the requeued key starts at attempt 0");
    assert!(h.parked().is_empty());
    assert_eq!(h.inspect(&key()).state, KeyStatus::Unknown);
    h.stop();
}

#[test]
fn parked_set_is_bounded_and_a_plain_enqueue_unparks() {
    let script = Script::new((0..5).map(|_| Step::Permanent("no")));
    let h = Controller::new("parked", script.clone()).parked_capacity(3).start();
    for k in ["a", "b", "c", "d", "e"] {
        h.enqueue(k.to_string());
        assert!(h.wait_idle(PATIENCE));
    }
    assert_eq!(h.parked(), ["c", "d", "e"], "oldest dropped first");
    h.enqueue("d".to_string());
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(h.parked(), ["c", "e"]);
    h.stop();
}

#[test]
fn a_panic_is_a_failure_retried_and_the_worker_survives() {
    let (h, script, clock) = play([Step::Panic("kaboom"), Step::Done]);
    assert_eq!(waiting_for(&h, &clock), secs(1), "handled like ReconcileError::new");
    let s = h.stats();
    assert_eq!((s.reconciles, s.failures, s.panics), (1, 1, 1));
    assert_eq!(s.last_error.as_deref(), Some("kaboom"));
    clock.advance(secs(1));
    assert!(h.wait_idle(PATIENCE));
    // The single worker ran the retry and another key.
    h.enqueue("other".to_string());
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(script.calls(), [(key(), 0), (key(), 1), ("other".to_string(), 0)]);
    assert_eq!(h.stats().successes, 2);
    h.stop();
}

#[test]
fn question_mark_gives_a_retryable_error() {
    #[allow(clippy::ptr_arg)] // the Reconciler<String> signature
    fn parse(key: &String, _: &Context) -> Result<Action, ReconcileError> {
        let _n: u32 = key.parse()?;
        Ok(Action::Done)
    }
    let err = parse(&"x".to_string(), &Context::detached(0)).unwrap_err();
    assert_eq!(err.retry_policy(), RetryPolicy::RateLimited);
    assert!(!err.is_permanent());
    assert_eq!(err.to_string(), "invalid digit found in string");
    let e = ReconcileError::retry_after(secs(2), String::from("later"));
    assert_eq!((e.retry_delay(), e.to_string().as_str()), (Some(secs(2)), "later"));
    assert!(ReconcileError::permanent(std::io::Error::other("io")).is_permanent());
}

#[test]
fn enqueue_after_and_enqueue_at_use_the_controller_clock() {
    let clock = FakeClock::new();
    let script = Script::new([]);
    let h = fake_controller(&script, &clock);
    h.enqueue_after(key(), secs(30));
    h.enqueue_at("at".to_string(), clock.now() + secs(60));
    assert_eq!(waiting_for(&h, &clock), secs(30));
    assert_eq!(h.inspect(&"at".to_string()).state, KeyStatus::Waiting { until: clock.now() + secs(60) });
    assert_eq!(h.stats().waiting, 2);
    clock.advance(secs(30));
    wait_for("first", || h.stats().reconciles == 1);
    clock.advance(secs(30));
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(script.calls(), [(key(), 0), ("at".to_string(), 0)]);
    h.stop();
}

#[test]
fn jitter_spreads_retries_deterministically() {
    fn first_delay(seed: u64, k: &str) -> std::time::Duration {
        let clock = FakeClock::new();
        let script = Script::new([Step::Fail("x")]);
        let h = Controller::new("jitter", script)
            .clock(clock.clone())
            .rate_limiter(ExponentialBackoff::new(secs(10), secs(1000)))
            .jitter(0.5, seed)
            .start();
        h.enqueue(k.to_string());
        let mut until = None;
        wait_for("waiting", || match h.inspect(&k.to_string()).state {
            KeyStatus::Waiting { until: u } => {
                until = Some(u);
                true
            }
            _ => false,
        });
        h.stop();
        until.unwrap() - clock.now()
    }
    let delays: Vec<_> = ["a", "b", "c", "d"].iter().map(|k| first_delay(7, k)).collect();
    for d in &delays {
        assert!(*d >= secs(5) && *d <= secs(15), "{d:?} outside 10 s ± 50%");
    }
    assert!(delays.windows(2).any(|w| w[0] != w[1]), "keys get different factors");
    assert_eq!(delays[0], first_delay(7, "a"), "same seed, key and attempt: same delay");
}

#[test]
fn the_default_limiter_retries_each_key_after_5_ms_without_an_overall_bucket() {
    // client-go's default adds a 10-per-second bucket (burst 100): keys past
    // the 100th would wait up to 10 s for their first retry.
    let clock = FakeClock::new();
    let h = Controller::new("default-limiter", |_: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        if ctx.attempt() == 0 { Err(ReconcileError::new("first try fails")) } else { Ok(Action::Done) }
    })
    .workers(2)
    .clock(clock.clone())
    .start();
    for k in 0..200 {
        h.enqueue(k);
    }
    wait_for("every key failed once", || h.stats().failures == 200);
    clock.advance(std::time::Duration::from_millis(5));
    assert!(h.wait_idle(PATIENCE), "every retry was due 5 ms after its failure: {:?}", h.stats());
    assert_eq!(h.stats().successes, 200);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn without_sharding_resync_runs_at_start_and_its_keys_are_reconciled() {
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    let c = Controller::new("resync-at-start", move |k: &u32, _: &Context| -> Result<Action, ReconcileError> {
        log.lock().push(*k);
        Ok(Action::Done)
    })
    .resync(|| [1, 2, 3]);
    let h = c.handle();
    h.enqueue(2); // enqueued before start too: still one reconcile
    let h = c.start();
    assert!(h.wait_idle(PATIENCE));
    let mut seen = seen.lock().clone();
    seen.sort_unstable();
    assert_eq!(seen, [1, 2, 3]);
    assert!(h.stop_with_drain(PATIENCE));
}
