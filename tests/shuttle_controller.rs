//! Model checking of the controller and the manager with shuttle.
//!
//! With the internal `shuttle` feature every lock, condvar and atomic that
//! the controller's worker loop, stop/drain, cancel paths and the manager's
//! controller threads synchronise through is shuttle's (`src/sync.rs`), and
//! the engine's threads are shuttle threads (`src/thread.rs`): a `Controller`
//! or `Manager` built inside a model runs entirely under shuttle's scheduler,
//! which picks the interleaving at every synchronisation point. Each model
//! below is run under shuttle's random scheduler and its PCT scheduler
//! (probabilistic concurrency testing: priority-based schedules that find
//! bugs of small depth with a known probability).
//!
//! Time: shuttle has no clock. The models use zero backoff (a retry is an
//! immediate re-add) and either zero timeouts or hour-long ones; under the
//! seam, a timed wait whose deadline has passed times out at once and any
//! other never times out, so a stop or wait that would hang until its
//! deadline makes shuttle report a deadlock instead of passing by luck. A
//! model that deadlocks (every thread blocked) fails.
//!
//! A reconcile's panics are caught by the worker (G9), so checks made inside
//! a reconcile record violations in the model's log; the model's main thread
//! asserts there are none.
//!
//! Run with `cargo test --features shuttle --test shuttle_controller` (the
//! model checker is optimised even in the test profile, see Cargo.toml).
//! `RECONQ_SHUTTLE_ITERATIONS=N` sets the schedules per scheduler and model
//! (default 10,000).
#![cfg(feature = "shuttle")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reconq::source::{Changes, Item, Listing, Stop};
use reconq::{
    Action, Cache, CacheError, Context, Controller, ControllerHandle, ControllerParams, DoError, ExponentialBackoff,
    FakeClock, LeaderElection, Manager, ReconcileError, Sharding, Source, SourceError, Watch, partition_of,
};
use shuttle::sync::{Condvar, Mutex};
use shuttle::thread;

/// Long enough never to be reached in a model (see the module docs on time).
const FOREVER: Duration = Duration::from_secs(3600);

fn iterations() -> usize {
    std::env::var("RECONQ_SHUTTLE_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000)
}

/// Runs `model` under the random scheduler and the PCT scheduler (depth 3).
fn explore(model: fn()) {
    let n = iterations();
    shuttle::check_random(model, n);
    shuttle::check_pct(model, n, 3);
}

/// Every model is deterministic given its schedule (no hidden real-time or
/// randomness decides anything), so a failing schedule printed by shuttle
/// replays exactly.
#[test]
fn models_are_deterministic() {
    let models: [fn(); 15] = [
        batch_closing_while_workers_finish_model,
        parent_ready_while_descendant_is_cancelled_model,
        parent_ready_racing_descendant_return_model,
        cache_relisting_while_controller_stops_model,
        stop_racing_start_runs_every_stop_hook_model,
        leadership_lost_during_reconciles_model,
        partition_handed_over_while_its_key_runs_model,
        worker_loop_requeue_racing_readds_model,
        group_limit_racing_finish_model,
        drain_racing_enqueues_and_start_model,
        stop_cancels_every_reconcile_model,
        || cancel_racing_completion_model(2),
        manager_update_racing_remove_and_trigger_model,
        manager_update_racing_trigger_runs_latest_do_model,
        manager_self_removal_racing_remove_all_model,
    ];
    for model in models {
        shuttle::check_uncontrolled_nondeterminism(model, 50);
    }
}

fn zero_backoff() -> ExponentialBackoff<u8> {
    ExponentialBackoff::new(Duration::ZERO, Duration::ZERO)
}

// ---------------------------------------------------------------------------
// (a) The worker loop: get / reconcile / settle / done_and_get, with requeues
// and retries racing a producer that re-adds the key.

/// What the workers and the producer of model (a) share.
#[derive(Default)]
struct Versions {
    /// Bumped by the producer before each enqueue, under this lock.
    version: HashMap<u8, u32>,
    /// The version each key's last-started reconcile saw.
    seen: HashMap<u8, u32>,
    /// Keys being reconciled right now.
    busy: HashMap<u8, bool>,
    started: u64,
    violations: Vec<String>,
}

/// **(a) get/done with requeue while a producer re-adds the key.** Two
/// workers, two keys, zero backoff. Each key's reconcile returns
/// `Action::Requeue` on its first attempt and a retryable error on its
/// second (both an immediate re-add, while the key is still processing, so
/// the queue marks it dirty), and succeeds on the third; a producer bumps a
/// key's version and enqueues it, racing all that.
///
/// Invariants: never two reconciles of one key at once (G2); once
/// `wait_idle` returns, the last reconcile of each key to start saw its
/// latest version (G3: an add after a reconcile began is always followed by
/// another reconcile), `stats()` counts every reconcile that started (the
/// retry is scheduled and counted before `done`), and the queue is empty;
/// `stop_with_drain` then finishes and every worker exits.
#[test]
fn worker_loop_requeue_racing_readds() {
    explore(worker_loop_requeue_racing_readds_model);
}

fn worker_loop_requeue_racing_readds_model() {
    let log = Arc::new(Mutex::new(Versions::default()));
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            {
                let mut log = log.lock().unwrap();
                if log.busy.insert(*key, true) == Some(true) {
                    log.violations.push(format!("G2: key {key} reconciled by two workers at once"));
                }
                let version = log.version.get(key).copied().unwrap_or(0);
                log.seen.insert(*key, version);
                log.started += 1;
            }
            thread::yield_now();
            log.lock().unwrap().busy.insert(*key, false);
            match ctx.attempt() {
                0 => Ok(Action::Requeue),
                1 => Err(ReconcileError::new("transient")),
                _ => Ok(Action::Done),
            }
        }
    };
    let handle = Controller::new("a", reconcile).workers(2).rate_limiter(zero_backoff()).start();
    let enqueue = |handle: &ControllerHandle<u8>, log: &Mutex<Versions>, key: u8| {
        // Under the log lock, so "after the reconcile began" is well defined.
        let mut log = log.lock().unwrap();
        *log.version.entry(key).or_default() += 1;
        handle.enqueue(key);
    };
    enqueue(&handle, &log, 0);
    enqueue(&handle, &log, 1);
    let producer = {
        let (handle, log) = (handle.clone(), Arc::clone(&log));
        thread::spawn(move || {
            enqueue(&handle, &log, 0);
            enqueue(&handle, &log, 1);
            enqueue(&handle, &log, 0);
        })
    };
    producer.join().unwrap();
    assert!(handle.wait_idle(FOREVER), "wait_idle gave up");
    {
        let log = log.lock().unwrap();
        assert_eq!(log.violations, Vec::<String>::new());
        for (key, version) in &log.version {
            assert_eq!(log.seen.get(key), Some(version), "G3: the last update of key {key} was never reconciled");
        }
        let stats = handle.stats();
        assert_eq!(stats.reconciles, log.started, "wait_idle returned before every reconcile was counted");
        assert_eq!((stats.depth, stats.processing, stats.waiting), (0, 0, 0), "idle, yet keys remain");
    }
    assert!(handle.stop_with_drain(FOREVER), "the drain did not finish");
    assert!(handle.is_stopped());
}

// ---------------------------------------------------------------------------
// (a') Per-group limits: a key of a full group becoming ready while a worker
// finishes another key of the same group.

#[derive(Default)]
struct GroupLog {
    /// Keys of each group being reconciled right now.
    in_flight: HashMap<u8, usize>,
    busy: HashMap<u8, bool>,
    ran: HashMap<u8, u32>,
    violations: Vec<String>,
}

/// **(a') per-group limit racing a finish.** Three workers, group
/// `key / 10`, `max_in_flight_per_group(1)`. Keys 10 and 11 share group 1;
/// key 20 is group 2. Key 10 asks to be requeued once (a re-add of a full
/// group's key while its own reconcile finishes). A producer enqueues 11
/// and 20 while 10 runs or finishes, and 10 again: every such add races the
/// worker that is releasing the group's slot in `done`.
///
/// Invariants: at most one key of a group is reconciled at once (P5); no
/// key is reconciled twice at once (G2); every key enqueued is reconciled
/// (the held key of a full group is handed out once room frees, not lost:
/// `wait_idle` returns, with nothing left ready or held, which a stranded
/// key would turn into a deadlock); the drain finishes.
#[test]
fn group_limit_racing_finish() {
    explore(group_limit_racing_finish_model);
}

fn group_limit_racing_finish_model() {
    let log = Arc::new(Mutex::new(GroupLog::default()));
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            let group = key / 10;
            {
                let mut log = log.lock().unwrap();
                let n = {
                    let n = log.in_flight.entry(group).or_default();
                    *n += 1;
                    *n
                };
                if n > 1 {
                    log.violations.push(format!("P5: {n} keys of group {group} at once (key {key})"));
                }
                if log.busy.insert(*key, true) == Some(true) {
                    log.violations.push(format!("G2: key {key} reconciled by two workers at once"));
                }
                *log.ran.entry(*key).or_default() += 1;
            }
            thread::yield_now();
            {
                let mut log = log.lock().unwrap();
                *log.in_flight.get_mut(&group).unwrap() -= 1;
                log.busy.insert(*key, false);
            }
            Ok(if *key == 10 && ctx.attempt() == 0 { Action::Requeue } else { Action::Done })
        }
    };
    let handle = Controller::new("g", reconcile)
        .workers(3)
        .rate_limiter(zero_backoff())
        .group(|key: &u8| key / 10)
        .max_in_flight_per_group(1)
        .start();
    handle.enqueue(10);
    let producer = {
        let handle = handle.clone();
        thread::spawn(move || {
            handle.enqueue(11);
            handle.enqueue(20);
            handle.enqueue(10);
        })
    };
    producer.join().unwrap();
    assert!(handle.wait_idle(FOREVER), "wait_idle gave up");
    {
        let log = log.lock().unwrap();
        assert_eq!(log.violations, Vec::<String>::new());
        for key in [10, 11, 20] {
            assert!(log.ran.get(&key).is_some_and(|&n| n >= 1), "key {key} was never reconciled");
        }
        let stats = handle.stats();
        assert_eq!((stats.depth, stats.processing, stats.waiting), (0, 0, 0), "idle, yet keys remain");
    }
    assert!(handle.stop_with_drain(FOREVER), "the drain did not finish");
}

// ---------------------------------------------------------------------------
// (b) Stop with drain racing enqueues (and start).

#[derive(Default)]
struct DrainLog {
    /// Set (under this lock) just before `stop_with_drain` is called.
    stop_requested: bool,
    /// Keys whose enqueue returned before the stop request.
    must_run: Vec<u8>,
    /// Reconciles started, by key.
    ran: HashMap<u8, u32>,
    /// Set once `stop_with_drain` returned.
    stop_returned: bool,
    violations: Vec<String>,
}

/// **(b) stop with drain racing enqueues, and start racing both.** A
/// producer enqueues three keys through a handle taken before `start`, so
/// its enqueues race `start` moving keys enqueued before it into the queue,
/// then race the drain; one key asks to be requeued once (the drain ignores
/// that re-add, as any add after shutdown). Two workers.
///
/// Invariants: every key whose enqueue returned before the stop request is
/// reconciled (none is lost between the handle, the pre-start pending list
/// and the queue); `stop_with_drain` returns, and reports that every worker
/// finished (with an hour-long timeout that shuttle never reaches, a drain
/// that hangs is a deadlock here); no reconcile starts after it returned;
/// the controller is stopped.
#[test]
fn drain_racing_enqueues_and_start() {
    explore(drain_racing_enqueues_and_start_model);
}

fn drain_racing_enqueues_and_start_model() {
    let log = Arc::new(Mutex::new(DrainLog::default()));
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            let mut log = log.lock().unwrap();
            if log.stop_returned {
                log.violations.push(format!("key {key} reconciled after the drain returned"));
            }
            *log.ran.entry(*key).or_default() += 1;
            Ok(if *key == 1 && ctx.attempt() == 0 { Action::Requeue } else { Action::Done })
        }
    };
    let controller = Controller::new("b", reconcile).workers(2).rate_limiter(zero_backoff());
    let producer = {
        let (handle, log) = (controller.handle(), Arc::clone(&log));
        thread::spawn(move || {
            for key in 0..3 {
                handle.enqueue(key);
                let mut log = log.lock().unwrap();
                if !log.stop_requested {
                    log.must_run.push(key);
                }
            }
        })
    };
    let handle = controller.start();
    log.lock().unwrap().stop_requested = true;
    assert!(handle.stop_with_drain(FOREVER), "the drain did not finish");
    log.lock().unwrap().stop_returned = true;
    producer.join().unwrap();
    let log = log.lock().unwrap();
    assert_eq!(log.violations, Vec::<String>::new());
    for key in &log.must_run {
        assert!(log.ran.contains_key(key), "key {key} was enqueued before the stop request but never reconciled");
    }
    assert!(handle.is_stopped());
}

/// **(b') an immediate stop racing workers that are starting reconciles.**
/// Every reconcile blocks until it is cancelled. `stop()` must cancel the
/// reconciles in flight and every later one (a worker that has taken a key
/// but not yet registered it in its slot must still see the stop), and the
/// controller must then stop: `wait_stopped` has no timeout, so a reconcile
/// that misses its cancel leaves the model deadlocked. A stop racing a
/// concurrent `stop_with_drain` whose deadline has already passed (timeout
/// zero) is included: both must return, and then every worker must exit
/// (`join_timeout` waits for all of them; the drain's deadline having passed
/// marks the controller stopped without them, so `wait_stopped` alone would
/// not notice a worker stuck in a reconcile).
#[test]
fn stop_cancels_every_reconcile() {
    explore(stop_cancels_every_reconcile_model);
}

fn stop_cancels_every_reconcile_model() {
    let reconcile = |_key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
        ctx.cancel_signal().wait();
        Ok(Action::Done)
    };
    let handle = Controller::new("b2", reconcile).workers(2).rate_limiter(zero_backoff()).start();
    for key in 0..3 {
        handle.enqueue(key);
    }
    let drainer = {
        let handle = handle.clone();
        thread::spawn(move || {
            handle.stop_with_drain_report(Duration::ZERO);
        })
    };
    handle.stop();
    assert!(handle.wait_stopped(None));
    drainer.join().unwrap();
    assert!(handle.join_timeout(FOREVER), "a worker never exited");
}

/// **(b4′) a stop racing the start's hook registrations** (the controller's
/// life, `controller/life.rs`). A standby controller (an election it does
/// not win) with a watchdog (a timeout) and a trigger waiting for its stop
/// signal is started while another thread stops it: the stop may come
/// before the start, between the start subscribing its features to the
/// stop and counting its workers, or after, with the worker waiting for
/// leadership. Invariant: every hook runs, whether registered before its
/// event (run by the thread that made it happen) or after (run at once by
/// the registering thread): the standby worker is woken and exits, the
/// watchdog and the trigger exit (`join_timeout` reaches no deadline in a
/// model), and the election seat is given up once no worker is left.
#[test]
fn stop_racing_start_runs_every_stop_hook() {
    explore(stop_racing_start_runs_every_stop_hook_model);
}

fn stop_racing_start_runs_every_stop_hook_model() {
    let election = LeaderElection::model("b4p");
    let reconcile = |_key: &u8, _ctx: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) };
    let controller = Controller::new("b4p", reconcile).timeout(FOREVER).leader_election(election.clone());
    let handle = controller.handle();
    handle.add_trigger(9, |stop: &reconq::StopSignal| {
        stop.wait();
        false
    });
    handle.enqueue(1);
    let stopper = {
        let handle = handle.clone();
        thread::spawn(move || handle.stop())
    };
    let _ = controller.try_start();
    stopper.join().unwrap();
    assert!(handle.join_timeout(FOREVER), "a thread never heard of the stop");
    assert!(handle.is_stopped());
    assert_eq!(election.model_seats(), 0, "the election seat was kept after the stop");
}

// ---------------------------------------------------------------------------
// (b3) Leadership lost while keys are being handed out and reconciled.

/// **(b3) a lease lost during reconciles** (guarantees §10, L3). Two
/// workers and three keys under an election the model wins with token 1;
/// a loser thread loses it (as a failed renewal does) at whatever point
/// shuttle picks: before a worker checks the token, between its check and
/// the reconcile, while reconciles run, as they return.
///
/// Invariants: every reconcile runs under token 1, and is cancelled by the
/// loss (each waits for the loss to be done, then must see its cancel):
/// none runs on, uncancelled, after its leadership ended, and none is
/// handed out after it. The standing-by workers exit on stop.
#[test]
fn leadership_lost_during_reconciles() {
    explore(leadership_lost_during_reconciles_model);
}

fn leadership_lost_during_reconciles_model() {
    #[derive(Default)]
    struct Log {
        lost: bool,
        violations: Vec<String>,
    }
    let log = Arc::new((Mutex::new(Log::default()), shuttle::sync::Condvar::new()));
    let election = LeaderElection::model("b3");
    election.model_win(1);
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            let (lock, lost_cv) = &*log;
            let mut l = lock.lock().unwrap();
            if ctx.fencing_token() != Some(1) {
                l.violations.push(format!("key {key} ran with token {:?}", ctx.fencing_token()));
            }
            // Whether it got here before or after the loss, it was handed
            // out before it: once the loss is done it must be cancelled.
            while !l.lost {
                l = lost_cv.wait(l).unwrap();
            }
            if !ctx.is_cancelled() {
                l.violations.push(format!("key {key} ran on uncancelled after the loss"));
            }
            Ok(Action::Done)
        }
    };
    let handle = Controller::new("b3", reconcile).workers(2).leader_election(election.clone()).start();
    for key in 0..3 {
        handle.enqueue(key);
    }
    let loser = {
        let (election, log) = (election.clone(), Arc::clone(&log));
        thread::spawn(move || {
            election.model_lose();
            log.0.lock().unwrap().lost = true;
            log.1.notify_all();
        })
    };
    loser.join().unwrap();
    handle.stop();
    assert!(handle.wait_stopped(None));
    assert!(handle.join_timeout(FOREVER), "a worker never exited");
    let violations = std::mem::take(&mut log.0.lock().unwrap().violations);
    assert!(violations.is_empty(), "{violations:?}");
}

// ---------------------------------------------------------------------------
// (b4) A partition handed over while its keys run.

/// **(b4) a partition handed over while its keys run** (guarantees §11,
/// H4). Two workers reconcile keys of two owned partitions (and requeue
/// each once, so keys keep being handed out); a giver thread gives
/// partition 0 up through the real hand-over steps (stop admitting its
/// keys, wait for its reconciles to return, then the point where its key
/// is deleted and a new owner may start) at whatever point shuttle picks.
///
/// Invariants: once the hand-over returned, no reconcile of a key of
/// partition 0 runs here or starts (the new owner's would overlap it);
/// every reconcile runs under its partition's token; keys of partition 1
/// are unaffected. Then stop, drain and exit as usual.
#[test]
fn partition_handed_over_while_its_key_runs() {
    explore(partition_handed_over_while_its_key_runs_model);
}

fn partition_handed_over_while_its_key_runs_model() {
    #[derive(Default)]
    struct Log {
        handed_over: bool,
        violations: Vec<String>,
    }
    const P: u32 = 2;
    let log = Arc::new(Mutex::new(Log::default()));
    let sharding = Sharding::model("b4", P);
    sharding.model_claim(0, 10);
    sharding.model_claim(1, 11);
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            let partition = partition_of(key, P);
            let check = |when: &str| {
                let mut l = log.lock().unwrap();
                if partition == 0 && l.handed_over {
                    l.violations.push(format!("key {key} of partition 0 {when} after its hand-over"));
                }
            };
            check("started");
            if ctx.fencing_token() != Some(10 + u64::from(partition)) {
                log.lock().unwrap().violations.push(format!("key {key} ran with token {:?}", ctx.fencing_token()));
            }
            thread::yield_now();
            check("still ran");
            Ok(if ctx.attempt() == 0 { Action::Requeue } else { Action::Done })
        }
    };
    let keys: Vec<u8> = (0..8)
        .filter(|k| partition_of(k, P) == 0)
        .take(2)
        .chain((0..8).filter(|k| partition_of(k, P) == 1).take(1))
        .collect();
    let handle =
        Controller::new("b4", reconcile).workers(2).rate_limiter(zero_backoff()).sharding(sharding.clone()).start();
    for key in &keys {
        handle.enqueue(*key);
    }
    let giver = {
        let (sharding, log) = (sharding.clone(), Arc::clone(&log));
        thread::spawn(move || {
            sharding.model_give_up(0);
            log.lock().unwrap().handed_over = true;
        })
    };
    giver.join().unwrap();
    assert!(handle.wait_idle(FOREVER));
    handle.stop();
    assert!(handle.wait_stopped(None));
    assert!(handle.join_timeout(FOREVER), "a worker never exited");
    let violations = std::mem::take(&mut log.lock().unwrap().violations);
    assert!(violations.is_empty(), "{violations:?}");
}

// ---------------------------------------------------------------------------
// (c) handle.cancel(key) racing the reconcile's return.

#[derive(Default)]
struct CancelLog {
    /// Started reconciles, by key.
    runs: HashMap<u8, u32>,
    /// What `cancel(A)` returned, once it has.
    cancel_returned: Option<bool>,
    violations: Vec<String>,
}

const A: u8 = 0;

/// **(c) `cancel(key)` racing completion.** Keys A, B, C, with one or two
/// workers; a canceller calls `handle.cancel(&A)` once, at whatever point
/// shuttle picks (before A starts, while it runs, as it returns, while the
/// worker moves on to the next key), then enqueues A again.
///
/// Invariants: a cancel never lands on a reconcile it was not aimed at: B
/// and C are never cancelled, and neither is A's second reconcile (it starts
/// after the cancel returned); a cancel that returned `true` while A's first
/// reconcile is still running is seen by it (never lost); one that returned
/// `false` is not seen by it. Then stop, drain and exit as usual.
#[test]
fn cancel_racing_completion_one_worker() {
    explore(|| cancel_racing_completion_model(1));
}

#[test]
fn cancel_racing_completion_two_workers() {
    explore(|| cancel_racing_completion_model(2));
}

fn cancel_racing_completion_model(workers: usize) {
    let log = Arc::new(Mutex::new(CancelLog::default()));
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            let run = {
                let mut log = log.lock().unwrap();
                let run = log.runs.entry(*key).or_default();
                *run += 1;
                *run
            };
            // Let the cancel land anywhere around here.
            thread::yield_now();
            let mut log = log.lock().unwrap();
            // Read after taking the log, so a cancel that returned is visible.
            let cancelled = ctx.is_cancelled();
            let violation = if *key != A {
                cancelled.then(|| format!("key {key} was cancelled, but only A ever was"))
            } else if run > 1 {
                cancelled.then(|| format!("A's reconcile #{run} saw the cancel meant for an earlier one"))
            } else {
                match log.cancel_returned {
                    Some(true) => {
                        (!cancelled).then(|| "cancel(A) returned true, but A's reconcile never saw it".into())
                    }
                    Some(false) => cancelled.then(|| "cancel(A) returned false, yet A's reconcile saw a cancel".into()),
                    None => None,
                }
            };
            log.violations.extend(violation);
            Ok(Action::Done)
        }
    };
    let controller = Controller::new("c", reconcile).workers(workers).rate_limiter(zero_backoff());
    let handle = controller.handle();
    for key in [A, 1, 2] {
        handle.enqueue(key);
    }
    let handle = controller.start();
    let canceller = {
        let (handle, log) = (handle.clone(), Arc::clone(&log));
        thread::spawn(move || {
            let found = handle.cancel(&A);
            log.lock().unwrap().cancel_returned = Some(found);
            handle.enqueue(A);
        })
    };
    canceller.join().unwrap();
    assert!(handle.wait_idle(FOREVER));
    {
        let log = log.lock().unwrap();
        assert_eq!(log.violations, Vec::<String>::new());
        // Two runs, or one if the second enqueue found A still waiting.
        assert!(matches!(log.runs.get(&A), Some(1 | 2)), "A ran {:?} times", log.runs.get(&A));
    }
    assert!(handle.stop_with_drain(FOREVER));
}

// ---------------------------------------------------------------------------
// (d) The manager: update racing remove and trigger.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Do(u8),
    Stop(u8),
    /// `update(.., params(2))` returned.
    Updated,
}

type Events = Arc<Mutex<Vec<Event>>>;

fn params(version: u8, events: &Events) -> ControllerParams {
    let (on_do, on_stop) = (Arc::clone(events), Arc::clone(events));
    ControllerParams::new(move || -> Result<(), DoError> {
        on_do.lock().unwrap().push(Event::Do(version));
        Ok(())
    })
    .stop(move || on_stop.lock().unwrap().push(Event::Stop(version)))
}

fn manager() -> Manager {
    // A fake clock: no run is ever timed, so no wait depends on real time.
    Manager::builder().clock(FakeClock::new()).build()
}

fn count(events: &[Event], event: Event) -> usize {
    events.iter().filter(|e| **e == event).count()
}

/// **(d) manager `update` racing `remove` and `trigger`.** A controller
/// created with parameters 1; then, at once, one thread updates it to
/// parameters 2, one removes it and one triggers it. The update lands either
/// on the controller before its removal (one controller, whose parameters
/// become 2) or after it (creating a second controller with parameters 2),
/// which the model tells apart afterwards by whether the name still exists.
/// Finally `remove_all_and_wait`.
///
/// Invariants, per controller: `stop` runs exactly once (never twice, never
/// zero times), only after its `do` ran at least once, and it is the stop
/// of the latest parameters the controller was given (a replaced stop is
/// dropped unrun); no `do` runs after its controller's `stop`; once a `do`
/// of parameters 2 ran, no `do` of parameters 1 runs on that controller;
/// every controller thread exits (`remove_all_and_wait` joins them; one that
/// never exits deadlocks the model).
#[test]
fn manager_update_racing_remove_and_trigger() {
    explore(manager_update_racing_remove_and_trigger_model);
}

fn manager_update_racing_remove_and_trigger_model() {
    let events: Events = Arc::default();
    let m = manager();
    m.update("c", params(1, &events));
    let updater = {
        let (m, events) = (m.clone(), Arc::clone(&events));
        thread::spawn(move || m.update("c", params(2, &events)))
    };
    let remover = {
        let m = m.clone();
        thread::spawn(move || m.remove("c").expect("the controller exists until removed here"))
    };
    let triggerer = {
        let m = m.clone();
        thread::spawn(move || {
            let _ = m.trigger("c"); // unknown if removed before and not re-created yet
        })
    };
    for t in [updater, remover, triggerer] {
        t.join().unwrap();
    }
    // The update created a second controller iff it came after the removal.
    let two_controllers = m.contains("c");
    m.remove_all_and_wait();
    let events = events.lock().unwrap().clone();
    let pos = |e: Event| events.iter().position(|x| *x == e);
    let first_do = |v: u8| pos(Event::Do(v));
    if two_controllers {
        // Controller 1 only ever had parameters 1; controller 2 parameters 2.
        for v in [1, 2] {
            assert_eq!(count(&events, Event::Stop(v)), 1, "controller {v}: stop ran not exactly once: {events:?}");
            let stop = pos(Event::Stop(v)).unwrap();
            assert!(first_do(v).is_some_and(|d| d < stop), "controller {v}: stop before any do: {events:?}");
            assert!(!events[stop..].contains(&Event::Do(v)), "controller {v}: do after stop: {events:?}");
        }
    } else {
        // One controller; its parameters became 2 before the removal.
        assert_eq!(count(&events, Event::Stop(1)), 0, "a replaced stop ran: {events:?}");
        assert_eq!(count(&events, Event::Stop(2)), 1, "stop ran not exactly once: {events:?}");
        assert_eq!(events.last(), Some(&Event::Stop(2)), "something ran after stop: {events:?}");
        assert!(events.iter().any(|e| matches!(e, Event::Do(_))), "stop before any do: {events:?}");
        if let Some(d2) = first_do(2) {
            assert!(!events[d2..].contains(&Event::Do(1)), "the old do ran after the new one: {events:?}");
        }
    }
}

/// **(d') manager `update` racing `trigger` and the first run: the latest
/// `do` is the one that runs.** A controller created with parameters 1;
/// one thread updates it to parameters 2 (and logs when `update` returned),
/// another triggers it. Once the controller is idle again (polled through
/// `controller_status`), it is removed with `remove_and_wait`.
///
/// Invariants: after `update` returned, at most one run of the old `do`
/// starts (one whose parameters were read before the update), and the last
/// run is of the new `do` (an update always leads to a run of its `do`); the
/// stop that runs is the new one, exactly once, last; the thread exits.
#[test]
fn manager_update_racing_trigger_runs_latest_do() {
    explore(manager_update_racing_trigger_runs_latest_do_model);
}

fn manager_update_racing_trigger_runs_latest_do_model() {
    let events: Events = Arc::default();
    let m = manager();
    m.update("c", params(1, &events));
    let updater = {
        let (m, events) = (m.clone(), Arc::clone(&events));
        thread::spawn(move || {
            m.update("c", params(2, &events));
            events.lock().unwrap().push(Event::Updated);
        })
    };
    let triggerer = {
        let m = m.clone();
        thread::spawn(move || m.trigger("c").expect("never removed here"))
    };
    updater.join().unwrap();
    triggerer.join().unwrap();
    loop {
        let status = m.controller_status("c").unwrap();
        if !status.running && status.next_run_in.is_none() {
            break;
        }
        thread::yield_now();
    }
    m.remove_and_wait("c").unwrap();
    let events = events.lock().unwrap().clone();
    let updated = events.iter().position(|e| *e == Event::Updated).unwrap();
    assert!(count(&events[updated..], Event::Do(1)) <= 1, "the old do kept running after the update: {events:?}");
    let last_do = events.iter().rev().find(|e| matches!(e, Event::Do(_)));
    assert_eq!(last_do, Some(&Event::Do(2)), "the new do never ran after the update: {events:?}");
    assert_eq!(count(&events, Event::Stop(1)), 0, "a replaced stop ran: {events:?}");
    assert_eq!(count(&events, Event::Stop(2)), 1, "stop ran not exactly once: {events:?}");
    assert_eq!(events.last(), Some(&Event::Stop(2)), "something ran after stop: {events:?}");
}

/// **(d'') a controller removing itself from its own `do`**, racing an
/// outside `remove_all_and_wait`: `remove_and_wait` called on the
/// controller's own thread must not join itself, `stop` runs once, and both
/// waits return.
#[test]
fn manager_self_removal_racing_remove_all() {
    explore(manager_self_removal_racing_remove_all_model);
}

fn manager_self_removal_racing_remove_all_model() {
    let events: Events = Arc::default();
    let m = manager();
    let weak = m.downgrade();
    let on_do = Arc::clone(&events);
    let on_stop = Arc::clone(&events);
    m.update(
        "self",
        ControllerParams::new(move || -> Result<(), DoError> {
            on_do.lock().unwrap().push(Event::Do(1));
            if let Some(m) = weak.upgrade() {
                let _ = m.remove_and_wait("self"); // unknown if the outside removal came first
            }
            Ok(())
        })
        .stop(move || on_stop.lock().unwrap().push(Event::Stop(1))),
    );
    let outside = {
        let m = m.clone();
        thread::spawn(move || m.remove_all_and_wait())
    };
    outside.join().unwrap();
    m.remove_all_and_wait();
    // If the controller removed itself first, nobody can join its thread
    // (it did not join itself): wait for its stop through the log.
    while !events.lock().unwrap().contains(&Event::Stop(1)) {
        thread::yield_now();
    }
    let events = events.lock().unwrap().clone();
    assert_eq!(events.first(), Some(&Event::Do(1)), "{events:?}");
    assert_eq!(count(&events, Event::Stop(1)), 1, "stop ran not exactly once: {events:?}");
    assert_eq!(events.last(), Some(&Event::Stop(1)), "{events:?}");
}

// ---------------------------------------------------------------------------
// A cache relisting while the controller watching it stops.

/// A source whose first stream expires at once (a compaction): the cache
/// relists, finding key 1 changed and key 2 new; the second stream blocks
/// until the cache stops.
#[derive(Default)]
struct RelistingSource {
    lists: u8,
}

impl Source for RelistingSource {
    type Key = u8;
    type Object = u8;
    type Position = u8;
    type Version = ();

    fn list(&mut self, _stop: &Stop) -> Result<Listing<u8, u8, u8, ()>, SourceError> {
        self.lists += 1;
        let items: Vec<(u8, u8)> = if self.lists == 1 { vec![(1, 1)] } else { vec![(1, 2), (2, 1)] };
        Ok(Listing { items: items.into_iter().map(Item::from).collect(), position: Some(self.lists) })
    }

    fn changes(&mut self, _from: Option<&u8>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        if self.lists == 1 {
            return Err(SourceError::expired("compacted"));
        }
        let stop = stop.clone();
        Ok(Box::new(std::iter::from_fn(move || {
            stop.wait_timeout(FOREVER);
            None
        })))
    }
}

#[test]
fn cache_relisting_while_controller_stops() {
    explore(cache_relisting_while_controller_stops_model);
}

/// **A cache relisting while its controller stops** (E2, E5, lifecycle).
/// The controller is the cache's only user; a stopper thread stops it at
/// whatever point shuttle picks: before or during its start, before the
/// first list, while the list or the relist is delivered to the
/// controller, while their keys are reconciled.
///
/// Invariants: nothing deadlocks (the stop joins the cache's thread, which
/// may be enqueueing into the stopping controller); no key is reconciled
/// before the cache synced; a reconcile of key 2 reads the state the relist
/// brought; the cache stops with its last user; and no reconcile runs once
/// the stop returned and the threads were joined.
fn cache_relisting_while_controller_stops_model() {
    let cache = Cache::builder("relisting", RelistingSource::default()).build().unwrap();
    // Per reconcile: its key, the cache's value for it, whether it synced.
    type Read = (u8, Option<u8>, bool);
    let seen: Arc<Mutex<Vec<Read>>> = Arc::default();
    let (log, reader) = (Arc::clone(&seen), cache.clone());
    let reconcile = move |key: &u8, _ctx: &Context| -> Result<Action, ReconcileError> {
        log.lock().unwrap().push((*key, reader.get(key).as_deref().copied(), reader.synced()));
        Ok(Action::Done)
    };
    let controller = Controller::new("relisting", reconcile).watch_cache(&cache, Watch::new());
    let handle = controller.handle();
    let stopper = {
        let handle = handle.clone();
        thread::spawn(move || handle.stop())
    };
    let started = controller.try_start().is_ok();
    stopper.join().unwrap();
    assert!(handle.join_timeout(FOREVER), "a thread never heard of the stop");
    if started {
        assert!(matches!(cache.acquire(), Err(CacheError::Stopped { .. })), "the cache outlived its last user");
    } else {
        assert!(!cache.synced(), "a controller stopped before start started its cache");
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|(.., synced)| *synced), "reconciled before the cache synced: {seen:?}");
    assert!(seen.iter().all(|(key, value, _)| *key != 2 || *value == Some(1)), "key 2 read a wrong state: {seen:?}");
    assert_eq!(handle.stats().reconciles as usize, seen.len(), "a reconcile after the stop");
}

// ---------------------------------------------------------------------------
// (d) Dependencies (guarantees §14): a parent becoming ready while a descendant's
// reconcile returns, or while it is being cancelled.

/// Keys of model (d): `DEP_P` → `DEP_C` → `DEP_G` (parent, child, grandchild).
const DEP_P: u8 = 0;
const DEP_C: u8 = 1;
const DEP_G: u8 = 2;

#[derive(Default)]
struct DepLog {
    running: Vec<u8>,
    /// ("start" | "end", key), in order.
    events: Vec<(&'static str, u8)>,
    violations: Vec<String>,
}

impl DepLog {
    fn last(&self, what: &str, key: u8) -> Option<usize> {
        self.events.iter().rposition(|e| *e == (what, key))
    }
}

/// **(d) a parent becoming ready while its descendants run or return.**
/// Two workers; edges P → C → G. C and G are enqueued and start (C runs
/// first: G is held by it); a thread enqueues P, racing C's reconcile from
/// before it starts to after it returned, and so racing D3's cancel of C
/// with C's return.
///
/// Invariants: a key never starts while an ancestor or a descendant runs
/// (D1; D3's "runs only after they returned"); once idle, the last run of
/// each child started after its parent's last run ended (D2 brings it back
/// whether or not it was cancelled); every reconcile is counted once, as a
/// success or as superseded; nothing is left held.
#[test]
fn parent_ready_racing_descendant_return() {
    explore(parent_ready_racing_descendant_return_model);
}

fn parent_ready_racing_descendant_return_model() {
    dependency_race_model(&[DEP_C, DEP_G], &[DEP_P]);
}

/// **(d') a parent becoming ready while its descendant is being
/// cancelled.** As (d), but only G is enqueued at first, and two threads
/// enqueue C and P: C's enqueue cancels G's reconcile (D3) and P's lands
/// before that cancelled run returned, while it returns or after, so G is
/// cancelled twice, or P waits for a run C already cancelled. The same
/// invariants as (d): P, then C, then G, each after the one above ended,
/// and no key waits for a run that already returned.
#[test]
fn parent_ready_while_descendant_is_cancelled() {
    explore(parent_ready_while_descendant_is_cancelled_model);
}

fn parent_ready_while_descendant_is_cancelled_model() {
    dependency_race_model(&[DEP_G], &[DEP_C, DEP_P]);
}

/// Models (d) and (d'): `initial` is enqueued before start, each of
/// `racers` by its own thread after it.
fn dependency_race_model(initial: &[u8], racers: &[u8]) {
    let log = Arc::new(Mutex::new(DepLog::default()));
    let ancestors = |key: u8| (0..key).collect::<Vec<u8>>();
    let descendants = |key: u8| (key + 1..=DEP_G).collect::<Vec<u8>>();
    let reconcile = {
        let log = Arc::clone(&log);
        move |key: &u8, ctx: &Context| -> Result<Action, ReconcileError> {
            {
                let mut log = log.lock().unwrap();
                let clash: Vec<u8> = log
                    .running
                    .iter()
                    .copied()
                    .filter(|k| ancestors(*key).contains(k) || descendants(*key).contains(k))
                    .collect();
                if !clash.is_empty() {
                    log.violations.push(format!("{key} started while {clash:?} ran"));
                }
                log.running.push(*key);
                log.events.push(("start", *key));
            }
            thread::yield_now();
            let _ = ctx.is_cancelled();
            thread::yield_now();
            let mut log = log.lock().unwrap();
            log.running.retain(|k| k != key);
            log.events.push(("end", *key));
            Ok(Action::Done)
        }
    };
    let controller = Controller::new("d", reconcile).workers(2).rate_limiter(zero_backoff());
    let handle = controller.handle();
    handle.set_dependencies(&DEP_C, [DEP_P]).unwrap();
    handle.set_dependencies(&DEP_G, [DEP_C]).unwrap();
    for &key in initial {
        handle.enqueue(key);
    }
    let handle = controller.start();
    let racers: Vec<_> = racers
        .iter()
        .map(|&key| {
            let handle = handle.clone();
            thread::spawn(move || handle.enqueue(key))
        })
        .collect();
    for racer in racers {
        racer.join().unwrap();
    }
    assert!(handle.wait_idle(FOREVER), "wait_idle gave up");
    let log = log.lock().unwrap();
    assert_eq!(log.violations, Vec::<String>::new());
    for (parent, child) in [(DEP_P, DEP_C), (DEP_C, DEP_G)] {
        let (end, start) = (log.last("end", parent), log.last("start", child));
        assert!(end < start, "{child}'s last run did not follow {parent}'s: {:?}", log.events);
    }
    let stats = handle.stats();
    let starts = log.events.iter().filter(|(what, _)| *what == "start").count() as u64;
    assert_eq!(stats.reconciles, starts, "{stats:?}");
    assert_eq!(stats.successes + stats.superseded, starts, "{stats:?}");
    assert_eq!((stats.held, stats.depth, stats.processing), (0, 0, 0), "{stats:?}");
    drop(log);
    assert!(handle.stop_with_drain(FOREVER));
}

// ---------------------------------------------------------------------------
// (e) Batches (guarantees §15, U3): a batch closing while workers finish.

/// Keys of model (e): `BAT_1` and `BAT_2` are ready before any batch;
/// `BAT_PARENT` → `BAT_CHILD` are enqueued inside one, child first.
const BAT_1: u8 = 1;
const BAT_2: u8 = 2;
const BAT_PARENT: u8 = 3;
const BAT_CHILD: u8 = 4;

#[derive(Default)]
struct BatchLog {
    /// Batches open, as the log knows them: counted up after a batch
    /// opened, down in the same critical section that closes it, so while
    /// this is above zero, some batch is open.
    open: u32,
    /// Bumped each time `open` leaves zero: a stretch of time in which
    /// some batch was open throughout.
    period: u32,
    /// For each key enqueued inside a batch: the period and the event
    /// index of that enqueue.
    enqueued: HashMap<u8, (u32, usize)>,
    /// ("start" | "end" | "enqueue", key), in order.
    events: Vec<(&'static str, u8)>,
    violations: Vec<String>,
}

impl BatchLog {
    fn open_batch(&mut self) {
        if self.open == 0 {
            self.period += 1;
        }
        self.open += 1;
    }

    /// Logs an enqueue made inside an open batch (before it is made).
    fn enqueue(&mut self, key: u8) {
        self.events.push(("enqueue", key));
        self.enqueued.insert(key, (self.period, self.events.len() - 1));
    }

    fn starts(&self, key: u8) -> Vec<usize> {
        self.events.iter().enumerate().filter(|(_, e)| **e == ("start", key)).map(|(at, _)| at).collect()
    }
}

/// **(e) a batch closing while workers finish.** Two workers. Keys 1 and
/// 2 are ready at start. Thread A opens a batch, enqueues the child, opens
/// a nested batch, enqueues key 1 again (ready, running or done by then),
/// closes the inner batch, enqueues the parent and closes the outer one;
/// thread B opens and closes a batch of its own, overlapping A's or not.
/// Workers finish 1 and 2 meanwhile, so the batch closes while a key
/// comes back from a worker and while workers wait for work.
///
/// Invariants: no run that an enqueue inside a batch caused (the child's,
/// the parent's, key 1's second) starts while the batches open since that
/// enqueue are all still open; the parent runs before the child (D1 across
/// the batch); nothing is lost: once idle, the parent and the child ran
/// once each, and key 1's last run started after its enqueue inside the
/// batch (G3); nothing is left held. A worker left waiting for a key that
/// the close released would leave `wait_idle` waiting for ever, which
/// shuttle reports as a deadlock.
#[test]
fn batch_closing_while_workers_finish() {
    explore(batch_closing_while_workers_finish_model);
}

fn batch_closing_while_workers_finish_model() {
    let log = Arc::new(Mutex::new(BatchLog::default()));
    let ended = Arc::new(Condvar::new());
    let reconcile = {
        let (log, ended) = (Arc::clone(&log), Arc::clone(&ended));
        move |key: &u8, _: &Context| -> Result<Action, ReconcileError> {
            {
                let mut log = log.lock().unwrap();
                // Key 1's first run may be the one ready before the batch.
                let caused_by_batch = *key != BAT_1 || !log.starts(BAT_1).is_empty();
                if let Some(&(period, _)) = log.enqueued.get(key)
                    && caused_by_batch
                    && log.open > 0
                    && log.period == period
                {
                    log.violations.push(format!("{key}, enqueued inside a batch, started before it closed"));
                }
                log.events.push(("start", *key));
            }
            thread::yield_now();
            log.lock().unwrap().events.push(("end", *key));
            ended.notify_all();
            Ok(Action::Done)
        }
    };
    let controller = Controller::new("e", reconcile).workers(2).rate_limiter(zero_backoff());
    let handle = controller.handle();
    handle.set_dependencies(&BAT_CHILD, [BAT_PARENT]).unwrap();
    handle.enqueue(BAT_1);
    handle.enqueue(BAT_2);
    let handle = controller.start();
    // Opens a batch and logs it; the returned closure closes it, logged
    // in the same critical section.
    let open = |handle: &ControllerHandle<u8>, log: &Arc<Mutex<BatchLog>>| {
        let batch = handle.batch();
        log.lock().unwrap().open_batch();
        let log = Arc::clone(log);
        move || {
            let mut log = log.lock().unwrap();
            drop(batch);
            log.open -= 1;
        }
    };
    let a = {
        let (handle, log) = (handle.clone(), Arc::clone(&log));
        thread::spawn(move || {
            let close_outer = open(&handle, &log);
            for (key, nested) in [(BAT_CHILD, false), (BAT_1, true), (BAT_PARENT, false)] {
                let close_inner = nested.then(|| open(&handle, &log));
                log.lock().unwrap().enqueue(key);
                handle.enqueue(key);
                if let Some(close) = close_inner {
                    close();
                }
            }
            close_outer();
        })
    };
    let b = {
        let (handle, log) = (handle.clone(), Arc::clone(&log));
        thread::spawn(move || open(&handle, &log)())
    };
    a.join().unwrap();
    b.join().unwrap();
    // Without a call into the queue (wait_idle would wake the workers
    // itself): the close alone must hand the keys out.
    let mut seen = log.lock().unwrap();
    while !seen.events.contains(&("end", BAT_CHILD)) {
        seen = ended.wait(seen).unwrap();
    }
    drop(seen);
    assert!(handle.wait_idle(FOREVER), "wait_idle gave up");
    let log = log.lock().unwrap();
    assert_eq!(log.violations, Vec::<String>::new());
    let (parent, child) = (log.starts(BAT_PARENT), log.starts(BAT_CHILD));
    assert!(parent.len() == 1 && child.len() == 1, "lost or repeated: {:?}", log.events);
    let parent_end = log.events.iter().position(|e| *e == ("end", BAT_PARENT));
    assert!(parent_end < Some(child[0]), "the child ran before its parent ended: {:?}", log.events);
    let enqueued_1 = log.enqueued[&BAT_1].1;
    assert!(log.starts(BAT_1).last() > Some(&enqueued_1), "key 1's enqueue was lost: {:?}", log.events);
    assert_eq!(log.starts(BAT_2).len(), 1, "{:?}", log.events);
    let stats = handle.stats();
    assert_eq!(stats.reconciles as usize, log.events.iter().filter(|(what, _)| *what == "start").count());
    assert_eq!((stats.held, stats.depth, stats.processing), (0, 0, 0), "{stats:?}");
    drop(log);
    assert!(handle.stop_with_drain(FOREVER));
}
