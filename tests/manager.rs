//! Named periodic controllers (guarantees §5). Time-dependent tests run on a
//! FakeClock: a controller's next run time is read from `status()` exactly,
//! then the test advances the clock and waits (with a generous timeout) for
//! the run to be recorded. Nothing sleeps and then asserts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use reconq::{ControllerParams, ControllerStatus, DoError, FakeClock, Manager, UnknownController};

const TIMEOUT: Duration = Duration::from_secs(20);
const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fake() -> (Manager, FakeClock) {
    let clock = FakeClock::new();
    (Manager::builder().clock(clock.clone()).build(), clock)
}

/// Polls `cond` until it holds, panicking after `TIMEOUT`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(ms(1));
    }
}

fn status(m: &Manager, name: &str) -> ControllerStatus {
    m.controller_status(name).expect("controller exists")
}

/// Waits until `name` has finished `runs` runs in all and is not running, and
/// returns its status (whose `next_run_in` is then settled).
fn wait_runs(m: &Manager, name: &str, runs: u64) -> ControllerStatus {
    let mut last = None;
    wait_for(&format!("{name} to finish {runs} runs"), || {
        let s = status(m, name);
        let done = s.successes + s.failures == runs && !s.running;
        last = Some(s);
        done
    });
    last.unwrap()
}

fn counting_do(
    count: &Arc<AtomicUsize>,
    result: impl Fn(usize) -> Result<(), DoError> + Send + Sync + 'static,
) -> impl Fn() -> Result<(), DoError> + Send + Sync + 'static {
    let count = Arc::clone(count);
    move || {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        result(n)
    }
}

#[test]
fn failures_back_off_linearly() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Err("nope".into()))));
    for n in 1..=4u32 {
        let s = wait_runs(&m, "c", u64::from(n));
        assert_eq!(s.failures, u64::from(n));
        assert_eq!(s.consecutive_failures, u64::from(n));
        assert_eq!(s.successes, 0);
        assert_eq!(s.last_error.as_deref(), Some("nope"));
        assert!(s.last_error_time.is_some());
        assert_eq!(s.next_run_in, Some(SEC * n), "wait after failure {n}");
        // Just short of the due time nothing runs.
        clock.advance(SEC * n - ms(1));
        assert_eq!(status(&m, "c").failures, u64::from(n));
        clock.advance(ms(1));
    }
    wait_runs(&m, "c", 5);
    m.remove_all_and_wait();
}

#[test]
fn error_retry_base_scales_the_backoff() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update(
        "c",
        ControllerParams::new(counting_do(&runs, |_| Err("nope".into())))
            .error_retry_base(ms(250))
            .run_interval(Duration::from_secs(3600)),
    );
    assert_eq!(wait_runs(&m, "c", 1).next_run_in, Some(ms(250)));
    clock.advance(ms(250));
    assert_eq!(wait_runs(&m, "c", 2).next_run_in, Some(ms(500)));
    m.remove_all_and_wait();
}

#[test]
fn max_retry_interval_caps_the_backoff() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Err("nope".into()))).max_retry_interval(ms(2500)));
    let expected = [SEC, 2 * SEC, ms(2500), ms(2500)];
    for (i, wait) in expected.into_iter().enumerate() {
        let s = wait_runs(&m, "c", i as u64 + 1);
        assert_eq!(s.next_run_in, Some(wait), "wait after failure {}", i + 1);
        clock.advance(wait);
    }
    wait_runs(&m, "c", 5);
    m.remove_all_and_wait();
}

#[test]
fn success_runs_again_after_the_interval() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Ok(()))).run_interval(ms(10_000)));
    for n in 1..=3 {
        let s = wait_runs(&m, "c", n);
        assert_eq!(s.successes, n);
        assert_eq!(s.failures, 0);
        assert!(s.last_success_time.is_some());
        assert!(s.last_duration.is_some());
        assert_eq!(s.next_run_in, Some(ms(10_000)));
        clock.advance(ms(9_999));
        assert_eq!(status(&m, "c").successes, n);
        clock.advance(ms(1));
    }
    wait_runs(&m, "c", 4);
    m.remove_all_and_wait();
}

#[test]
fn success_without_interval_parks_until_trigger() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Ok(()))));
    let s = wait_runs(&m, "c", 1);
    assert_eq!(s.next_run_in, None);
    clock.advance(Duration::from_secs(100_000));
    assert_eq!(status(&m, "c").successes, 1);
    m.trigger("c").unwrap();
    wait_runs(&m, "c", 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    m.remove_all_and_wait();
}

#[test]
fn success_clears_last_error() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update(
        "c",
        ControllerParams::new(counting_do(&runs, |n| if n <= 2 { Err(format!("fail {n}").into()) } else { Ok(()) }))
            .run_interval(ms(30_000)),
    );
    let s = wait_runs(&m, "c", 1);
    assert_eq!(s.last_error.as_deref(), Some("fail 1"));
    assert!(s.last_error_time.is_some());
    assert!(s.last_success_time.is_none());
    clock.advance(SEC);
    let s = wait_runs(&m, "c", 2);
    assert_eq!(s.last_error.as_deref(), Some("fail 2"));
    assert_eq!(s.consecutive_failures, 2);
    clock.advance(2 * SEC);
    let s = wait_runs(&m, "c", 3);
    assert_eq!((s.successes, s.failures, s.consecutive_failures), (1, 2, 0));
    assert_eq!(s.last_error, None);
    assert_eq!(s.last_error_time, None);
    assert!(s.last_success_time.is_some());
    assert_eq!(s.next_run_in, Some(ms(30_000)), "back on the interval after a success");
    m.remove_all_and_wait();
}

#[test]
fn no_error_retry_waits_the_interval() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update(
        "c",
        ControllerParams::new(counting_do(&runs, |_| Err("nope".into()))).run_interval(ms(5000)).no_error_retry(true),
    );
    for n in 1..=3 {
        let s = wait_runs(&m, "c", n);
        assert_eq!(s.consecutive_failures, n);
        assert_eq!(s.next_run_in, Some(ms(5000)));
        clock.advance(ms(5000));
    }
    wait_runs(&m, "c", 4);
    m.remove_all_and_wait();
}

#[test]
fn no_error_retry_without_interval_waits_for_an_update() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Err("nope".into()))).no_error_retry(true));
    let s = wait_runs(&m, "c", 1);
    assert_eq!(s.failures, 1);
    assert_eq!(s.next_run_in, None);
    clock.advance(Duration::from_secs(100_000));
    assert_eq!(status(&m, "c").failures, 1);
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Ok(()))).no_error_retry(true));
    let s = wait_runs(&m, "c", 2);
    assert_eq!((s.successes, s.failures), (1, 1));
    m.remove_all_and_wait();
}

#[test]
fn update_replaces_params_and_runs_at_once() {
    let (m, _clock) = fake();
    let first = Arc::new(AtomicUsize::new(0));
    let second = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&first, |_| Ok(()))).run_interval(Duration::from_secs(3600)));
    wait_runs(&m, "c", 1);
    m.update("c", ControllerParams::new(counting_do(&second, |_| Err("new".into()))).error_retry_base(ms(300)));
    let s = wait_runs(&m, "c", 2);
    assert_eq!(first.load(Ordering::SeqCst), 1);
    assert_eq!(second.load(Ordering::SeqCst), 1);
    assert_eq!(s.last_error.as_deref(), Some("new"));
    assert_eq!(s.next_run_in, Some(ms(300)), "the new params' backoff applies");
    assert_eq!(m.names(), ["c"]);
    m.remove_all_and_wait();
}

/// Updates and triggers while a run is in progress collapse into one run
/// after it, and runs of one controller never overlap.
#[test]
fn updates_during_a_run_coalesce_into_one_run() {
    let (m, _clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    let active = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let gate_rx = Arc::new(Mutex::new(gate_rx));
    let make = || {
        let (runs, active, overlap) = (runs.clone(), active.clone(), overlap.clone());
        let (started_tx, gate_rx) = (Mutex::new(started_tx.clone()), gate_rx.clone());
        ControllerParams::new(move || {
            if active.fetch_add(1, Ordering::SeqCst) != 0 {
                overlap.fetch_add(1, Ordering::SeqCst);
            }
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 1 {
                started_tx.lock().unwrap().send(()).unwrap();
                gate_rx.lock().unwrap().recv_timeout(TIMEOUT).unwrap();
            }
            active.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
    };
    m.update("c", make());
    started_rx.recv_timeout(TIMEOUT).unwrap();
    for _ in 0..10 {
        m.update("c", make());
        m.trigger("c").unwrap();
    }
    assert!(status(&m, "c").running);
    gate_tx.send(()).unwrap();
    let s = wait_runs(&m, "c", 2);
    assert_eq!(s.next_run_in, None, "no further run pending");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(overlap.load(Ordering::SeqCst), 0);
    m.remove_all_and_wait();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[test]
fn stop_runs_once_after_do() {
    let (m, _clock) = fake();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (l1, l2) = (log.clone(), log.clone());
    m.update(
        "c",
        ControllerParams::new(move || {
            l1.lock().unwrap().push("do");
            Ok(())
        })
        .stop(move || l2.lock().unwrap().push("stop")),
    );
    wait_runs(&m, "c", 1);
    m.remove_and_wait("c").unwrap();
    assert_eq!(*log.lock().unwrap(), ["do", "stop"]);
    assert!(m.is_empty());
}

/// As in Cilium, `stop` runs only after `do` ran at least once: a controller
/// removed before its first run still runs `do` once.
#[test]
fn removal_before_the_first_run_still_runs_do_once() {
    for _ in 0..20 {
        let (m, _clock) = fake();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (l1, l2) = (log.clone(), log.clone());
        m.update(
            "c",
            ControllerParams::new(move || {
                l1.lock().unwrap().push("do");
                Err("failing".into())
            })
            .stop(move || l2.lock().unwrap().push("stop")),
        );
        m.remove_and_wait("c").unwrap();
        assert_eq!(*log.lock().unwrap(), ["do", "stop"]);
    }
}

#[test]
fn only_the_latest_stop_runs() {
    let (m, _clock) = fake();
    let stops = Arc::new(Mutex::new(Vec::new()));
    for name in ["first", "second", "third"] {
        let stops = stops.clone();
        m.update("c", ControllerParams::new(|| Ok(())).stop(move || stops.lock().unwrap().push(name)));
    }
    m.remove_and_wait("c").unwrap();
    assert_eq!(*stops.lock().unwrap(), ["third"]);
}

#[test]
fn exit_reason_parks_and_counts_as_success() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Err(DoError::exit("nothing to do")))).run_interval(SEC));
    let s = wait_runs(&m, "c", 1);
    assert_eq!((s.successes, s.failures, s.consecutive_failures), (1, 0, 0));
    assert_eq!(s.last_error.as_deref(), Some("nothing to do"));
    assert!(s.last_error_time.is_some());
    assert_eq!(s.next_run_in, None, "parked despite the interval");
    clock.advance(Duration::from_secs(1000));
    assert_eq!(status(&m, "c").successes, 1);
    m.trigger("c").unwrap();
    wait_runs(&m, "c", 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    m.remove_all_and_wait();
}

#[test]
fn panic_in_do_counts_as_failure_and_the_thread_survives() {
    let (m, clock) = fake();
    let runs = Arc::new(AtomicUsize::new(0));
    m.update(
        "c",
        ControllerParams::new(counting_do(&runs, |n| if n == 1 { panic!("boom") } else { Ok(()) })).run_interval(SEC),
    );
    let s = wait_runs(&m, "c", 1);
    assert_eq!(s.failures, 1);
    assert_eq!(s.last_error.as_deref(), Some("panicked: boom"));
    assert_eq!(s.next_run_in, Some(SEC));
    clock.advance(SEC);
    let s = wait_runs(&m, "c", 2);
    assert_eq!((s.successes, s.failures), (1, 1));
    m.remove_all_and_wait();
}

#[test]
fn status_is_sorted_by_name() {
    let (m, _clock) = fake();
    for name in ["b", "c", "a", "ab"] {
        m.update(name, ControllerParams::new(|| Ok(())));
    }
    let names: Vec<String> = m.status().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["a", "ab", "b", "c"]);
    assert_eq!(m.len(), 4);
    assert!(m.contains("ab"));
    m.remove_all_and_wait();
    assert!(m.status().is_empty());
}

#[test]
fn unknown_names_are_errors() {
    let (m, _clock) = fake();
    let unknown = UnknownController { name: "ghost".into() };
    assert_eq!(m.remove("ghost"), Err(unknown.clone()));
    assert_eq!(m.remove_and_wait("ghost"), Err(unknown.clone()));
    assert_eq!(m.trigger("ghost"), Err(unknown.clone()));
    assert_eq!(m.controller_status("ghost").unwrap_err(), unknown);
    m.update("real", ControllerParams::new(|| Ok(())));
    m.remove("real").unwrap();
    assert!(m.remove("real").is_err(), "a removed name is unknown");
}

#[test]
fn remove_runs_stop_in_the_background() {
    let (m, _clock) = fake();
    let (tx, rx) = mpsc::channel();
    m.update("c", ControllerParams::new(|| Ok(())).stop(move || tx.send(()).unwrap()));
    m.remove("c").unwrap();
    assert!(!m.contains("c"));
    rx.recv_timeout(TIMEOUT).expect("stop ran");
}

#[test]
fn remove_all_stops_every_controller() {
    let (m, _clock) = fake();
    let stops = Arc::new(AtomicUsize::new(0));
    for i in 0..5 {
        let stops = stops.clone();
        m.update(
            format!("c{i}"),
            ControllerParams::new(|| Ok(())).run_interval(SEC).stop(move || {
                stops.fetch_add(1, Ordering::SeqCst);
            }),
        );
    }
    m.remove_all();
    assert!(m.is_empty());
    wait_for("every stop", || stops.load(Ordering::SeqCst) == 5);

    for i in 0..5 {
        let stops = stops.clone();
        m.update(
            format!("d{i}"),
            ControllerParams::new(|| Ok(())).stop(move || {
                stops.fetch_add(1, Ordering::SeqCst);
            }),
        );
    }
    m.remove_all_and_wait();
    assert_eq!(stops.load(Ordering::SeqCst), 10);
}

#[test]
fn dropping_the_manager_removes_its_controllers() {
    let (m, _clock) = fake();
    let (tx, rx) = mpsc::channel();
    m.update("c", ControllerParams::new(|| Ok(())).run_interval(SEC).stop(move || tx.send(()).unwrap()));
    wait_runs(&m, "c", 1);
    let clone = m.clone();
    drop(m);
    assert!(rx.recv_timeout(ms(50)).is_err(), "a clone still holds the manager");
    drop(clone);
    rx.recv_timeout(TIMEOUT).expect("stop ran after the last handle dropped");
}

#[test]
fn controller_threads_are_named() {
    let (m, _clock) = fake();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    m.update(
        "routes",
        ControllerParams::new(move || {
            tx.lock().unwrap().send(thread::current().name().map(str::to_owned)).unwrap();
            Ok(())
        }),
    );
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap().as_deref(), Some("reconq-mgr-routes"));
    m.remove_all_and_wait();
}

#[test]
fn thread_wrapper_wraps_every_controller_thread() {
    let wrapped = Arc::new(AtomicUsize::new(0));
    let w = wrapped.clone();
    let m = Manager::builder()
        .clock(FakeClock::new())
        .thread_wrapper(Arc::new(move |body: &mut dyn FnMut()| {
            w.fetch_add(1, Ordering::SeqCst);
            body();
        }))
        .build();
    m.update("a", ControllerParams::new(|| Ok(())));
    m.update("b", ControllerParams::new(|| Ok(())));
    m.update("a", ControllerParams::new(|| Ok(())));
    m.remove_all_and_wait();
    assert_eq!(wrapped.load(Ordering::SeqCst), 2);
}

/// `do` may remove its own controller, even waiting, without deadlocking.
#[test]
fn do_can_remove_its_own_controller() {
    let (m, _clock) = fake();
    let (tx, rx) = mpsc::channel();
    let handle = m.clone();
    m.update(
        "self",
        ControllerParams::new(move || {
            handle.remove_and_wait("self").unwrap();
            Ok(())
        })
        .stop(move || tx.send(()).unwrap()),
    );
    rx.recv_timeout(TIMEOUT).expect("stop ran");
    assert!(m.is_empty());
}

/// On the real clock the thread sleeps with a timed wait until its due time.
#[test]
fn real_clock_runs_on_the_interval() {
    let m = Manager::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    m.update("c", ControllerParams::new(counting_do(&runs, |_| Ok(()))).run_interval(ms(20)));
    wait_for("three runs", || runs.load(Ordering::SeqCst) >= 3);
    assert!(start.elapsed() >= ms(40), "runs 2 and 3 waited the interval");
    m.remove_all_and_wait();
}

/// A `do` holding a WeakManager does not keep the manager alive.
#[test]
fn weak_manager_lets_a_drop_stop_the_controllers() {
    let (m, _clock) = fake();
    let (tx, rx) = mpsc::channel();
    let weak = m.downgrade();
    let triggers = Arc::new(AtomicUsize::new(0));
    let t = triggers.clone();
    m.update(
        "c",
        ControllerParams::new(move || {
            if let Some(m) = weak.upgrade() {
                assert!(m.contains("c"));
                t.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        })
        .stop(move || tx.send(()).unwrap()),
    );
    wait_runs(&m, "c", 1);
    assert_eq!(triggers.load(Ordering::SeqCst), 1);
    let weak = m.downgrade();
    drop(m);
    rx.recv_timeout(TIMEOUT).expect("stop ran after the last handle dropped");
    assert!(weak.upgrade().is_none());
}

/// A `do` that reports its attempt, then blocks until its context is
/// cancelled and reports that it was.
fn cancellable_do(tx: mpsc::Sender<(u32, bool)>) -> ControllerParams {
    let tx = Mutex::new(tx);
    ControllerParams::with_context(move |ctx| {
        let cancelled = ctx.wait_cancelled(TIMEOUT);
        tx.lock().unwrap().send((ctx.attempt(), cancelled)).unwrap();
        Ok(())
    })
}

#[test]
fn a_running_do_is_cancelled_by_remove_update_and_drop() {
    let m = Manager::new();
    let (tx, rx) = mpsc::channel();
    m.update("removed", cancellable_do(tx.clone()));
    wait_for("the do to run", || status(&m, "removed").running);
    m.remove("removed").unwrap();
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), (0, true));

    m.update("replaced", cancellable_do(tx.clone()));
    wait_for("the do to run", || status(&m, "replaced").running);
    m.update("replaced", ControllerParams::new(|| Ok(())));
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), (0, true));

    m.update("dropped", cancellable_do(tx));
    wait_for("the do to run", || status(&m, "dropped").running);
    drop(m);
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), (0, true));
}

#[test]
fn a_trigger_does_not_cancel_a_running_do_and_attempt_counts_failures() {
    let (m, clock) = fake();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    m.update(
        "flaky",
        ControllerParams::with_context(move |ctx| {
            seen.lock().unwrap().push((ctx.attempt(), ctx.is_cancelled()));
            Err("down".into())
        }),
    );
    wait_runs(&m, "flaky", 1);
    m.trigger("flaky").unwrap();
    wait_runs(&m, "flaky", 2);
    clock.advance(2 * SEC);
    wait_runs(&m, "flaky", 3);
    assert_eq!(*attempts.lock().unwrap(), vec![(0, false), (1, false), (2, false)]);
}
