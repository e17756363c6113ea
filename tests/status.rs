//! The global status (`reconq::status`): exact entries after known sequences
//! of reconciles and periodic runs, on fake clocks; entries follow their
//! objects' lifetimes; the table's rows and columns.
//!
//! The status is process-wide and tests run in parallel, so every test uses
//! names of its own and looks only at its entries. Waits are on conditions
//! (a settled queue, a recorded run), never sleeps.

mod common;

use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use common::{Gate, PATIENCE, parent_held_by_cancelled_child, secs, wait_for};
use reconq::status::{self, ControllerDetails, EntryKind, PeriodicDetails, RunState, StatusEntry};
use reconq::{
    Action, Context, Controller, ControllerParams, DoError, ExponentialBackoff, FakeClock, Manager, ReconcileError,
};

/// The only entry named `name` (of either kind).
fn entry(name: &str) -> StatusEntry {
    let mut found: Vec<StatusEntry> = status::snapshot().into_iter().filter(|e| e.name == name).collect();
    assert_eq!(found.len(), 1, "entries named {name:?}: {found:?}");
    found.pop().unwrap()
}

fn details(e: &StatusEntry) -> &ControllerDetails {
    e.controller().unwrap_or_else(|| panic!("not a controller: {e:?}"))
}

/// Waits until `name`'s entry satisfies `cond`, then returns a fresh entry.
/// Conditions on the queue (`processing`, `waiting`) make the counters final:
/// an entry reads the queue before the counters, and a worker counts a
/// reconcile before marking its key done.
fn entry_when(name: &str, what: &str, cond: impl Fn(&StatusEntry) -> bool) -> StatusEntry {
    wait_for(what, || cond(&entry(name)));
    entry(name)
}

fn periodic(manager: &str) -> Vec<StatusEntry> {
    status::snapshot().into_iter().filter(|e| e.periodic().is_some_and(|p| p.manager == manager)).collect()
}

#[test]
fn a_controller_entry_after_a_known_sequence() {
    const NAME: &str = "status-sequence";
    let clock = FakeClock::new();
    let gate = Gate::new();
    let hang = gate.clone();
    let reconcile = move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        match (key.as_str(), ctx.attempt()) {
            ("ok", _) => Ok(Action::Done),
            ("flaky", 0 | 1) => Err(ReconcileError::new("flaky backend")),
            ("flaky", _) => Ok(Action::Done),
            ("perm", _) => Err(ReconcileError::permanent("bad spec")),
            ("later", _) => Ok(Action::RequeueAfter(secs(3600))),
            ("boom", 0) => panic!("kaboom"),
            ("boom", _) => Ok(Action::Done),
            ("hang", _) => {
                hang.pass();
                Ok(Action::Done)
            }
            (other, _) => unreachable!("unexpected key {other}"),
        }
    };
    let controller = Controller::new(NAME, reconcile)
        .workers(2)
        .clock(clock.clone())
        .rate_limiter(ExponentialBackoff::new(secs(1), secs(1000)))
        .hanging_threshold(secs(1));
    let handle = controller.handle();
    handle.enqueue("ok".to_string());

    // Not started: the enqueued key waits; nothing has run.
    let e = entry(NAME);
    assert_eq!(e.kind.label(), "controller");
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (0, 0, 0));
    assert_eq!((e.last_error.clone(), e.last_error_time, e.last_success_time), (None, None, None));
    let d = details(&e);
    assert_eq!((d.state, d.workers, d.depth, d.reconciles), (RunState::NotStarted, 2, 1, 0));
    assert_eq!(d.hanging_threshold, Some(secs(1)));
    assert_eq!(e.state(), "not started");

    // One success.
    let before = SystemTime::now();
    let handle = controller.start();
    assert!(handle.wait_idle(PATIENCE));
    let e = entry(NAME);
    let after = SystemTime::now();
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (1, 0, 0));
    let success_time = e.last_success_time.expect("a success time");
    assert!(before <= success_time && success_time <= after);
    assert_eq!(details(&e).state, RunState::Running);
    assert_eq!((details(&e).reconciles, details(&e).depth, details(&e).processing), (1, 0, 0));

    // Two failures in a row (retried after 1 s, then 2 s), then a success.
    handle.enqueue("flaky".to_string());
    let e = entry_when(NAME, "the first failure", |e| {
        let d = details(e);
        d.reconciles == 2 && d.processing == 0 && d.waiting == 1
    });
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (1, 1, 1));
    assert_eq!(e.last_error.as_deref(), Some("flaky backend"));
    let first_error_time = e.last_error_time.expect("an error time");
    assert!(first_error_time >= success_time);
    clock.advance(secs(1));
    let e = entry_when(NAME, "the second failure", |e| {
        let d = details(e);
        d.reconciles == 3 && d.processing == 0 && d.waiting == 1
    });
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (1, 2, 2));
    assert!(e.last_error_time.unwrap() >= first_error_time);
    clock.advance(secs(2));
    let e = entry_when(NAME, "the retry's success", |e| {
        let d = details(e);
        d.reconciles == 4 && d.processing == 0 && d.waiting == 0
    });
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (2, 2, 0), "a success ends the streak");
    assert_eq!(e.last_error.as_deref(), Some("flaky backend"), "a controller keeps its last error");
    assert!(e.last_success_time.unwrap() >= e.last_error_time.unwrap());

    // A permanent error parks the key; a resync (`RequeueAfter`) did its
    // work: a success, which ends the failure streak.
    handle.enqueue("perm".to_string());
    assert!(handle.wait_idle(PATIENCE));
    let e = entry(NAME);
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (2, 3, 1));
    assert_eq!(e.last_error.as_deref(), Some("bad spec"));
    assert_eq!((details(&e).parked, details(&e).reconciles), (1, 5));
    handle.enqueue("later".to_string());
    let e = entry_when(NAME, "the resync", |e| {
        let d = details(e);
        d.reconciles == 6 && d.processing == 0 && d.waiting == 1
    });
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (3, 3, 0));
    assert_eq!(details(&e).requeues, 0);

    // A panic is a failure (retried after 1 s).
    handle.enqueue("boom".to_string());
    let e = entry_when(NAME, "the panic", |e| {
        let d = details(e);
        d.reconciles == 7 && d.processing == 0 && d.waiting == 2
    });
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (3, 4, 1));
    assert_eq!((details(&e).panics, e.last_error.as_deref()), (1, Some("kaboom")));

    // A reconcile held on a channel hangs past the 1 s threshold; meanwhile
    // the panicked key's retry succeeds on the other worker.
    handle.enqueue("hang".to_string());
    gate.wait_arrivals(1);
    clock.advance(secs(2));
    let e = entry_when(NAME, "the retry beside the hang", |e| {
        let d = details(e);
        d.reconciles == 8 && d.processing == 1 && d.waiting == 1
    });
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (4, 4, 0));
    let d = details(&e);
    assert_eq!((d.depth, d.parked, d.requeues, d.panics), (0, 1, 0, 1));
    assert_eq!(d.hanging.len(), 1, "{:?}", d.hanging);
    assert_eq!(d.hanging[0].key, "\"hang\"");
    assert_eq!(d.hanging[0].running, secs(2));
    assert_eq!(d.hanging[0].downcast_ref::<String>().map(String::as_str), Some("hang"));
    let table = status::format_table(std::slice::from_ref(&e));
    assert!(table.contains("\"hang\" 2.0s"), "{table}");
    assert!(table.starts_with("reconq status: 1 controller, 0 periodic; 0 failing, 1 hanging\n"), "{table}");

    gate.release();
    let e = entry_when(NAME, "the hang's end", |e| details(e).reconciles == 9 && details(e).processing == 0);
    assert_eq!((e.successes, e.failures, e.consecutive_failures), (5, 4, 0));
    assert!(details(&e).hanging.is_empty());

    assert!(handle.stop_with_drain(PATIENCE));
    let e = entry(NAME);
    let d = details(&e);
    assert_eq!((d.state, d.waiting, d.reconciles), (RunState::Stopped, 0, 9), "the delayed key was dropped");
    assert_eq!((e.successes, e.failures, d.requeues, d.panics, d.parked), (5, 4, 0, 1, 1));
}

#[test]
fn stopping_shows_until_the_workers_exit() {
    const NAME: &str = "status-stopping";
    let gate = Gate::new();
    let handle = Controller::new(NAME, gate.reconcile::<u8>()).start();
    handle.enqueue(1);
    gate.wait_arrivals(1);
    handle.stop();
    assert_eq!(details(&entry(NAME)).state, RunState::Stopping);
    gate.release();
    assert!(handle.wait_stopped(Some(PATIENCE)));
    assert_eq!(details(&entry(NAME)).state, RunState::Stopped);
}

#[test]
fn periodic_entries_after_a_known_sequence() {
    const MANAGER: &str = "status-manager";
    let clock = FakeClock::new();
    let manager = Manager::builder().name(MANAGER).clock(clock.clone()).build();
    assert_eq!(manager.name(), MANAGER);
    assert_eq!(Manager::new().name(), "manager");
    manager.update("sync", ControllerParams::new(|| -> Result<(), DoError> { Ok(()) }));
    manager.update("broken", ControllerParams::new(|| -> Result<(), DoError> { Err("nope".into()) }));
    let settled = |name: &str, runs: u64| {
        let s = manager.controller_status(name).unwrap();
        s.successes + s.failures == runs && !s.running
    };
    wait_for("both first runs", || settled("sync", 1) && settled("broken", 1));

    let entries = periodic(MANAGER);
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["broken", "sync"], "sorted by name");
    let broken = &entries[0];
    assert_eq!((broken.successes, broken.failures, broken.consecutive_failures), (0, 1, 1));
    assert_eq!(broken.last_error.as_deref(), Some("nope"));
    assert!(broken.last_error_time.is_some() && broken.last_success_time.is_none());
    assert_eq!(
        broken.kind,
        EntryKind::Periodic(PeriodicDetails {
            manager: MANAGER.into(),
            running: false,
            leader: None,
            last_duration: Some(Duration::ZERO),
            next_run_in: Some(secs(1)),
        })
    );
    assert_eq!((broken.state(), broken.qualified_name().as_str()), ("scheduled", "status-manager/broken"));
    let sync = &entries[1];
    assert_eq!((sync.successes, sync.failures, sync.consecutive_failures), (1, 0, 0));
    assert!(sync.last_error.is_none() && sync.last_error_time.is_none() && sync.last_success_time.is_some());
    assert_eq!(
        (sync.state(), sync.periodic().unwrap().next_run_in),
        ("idle", None),
        "no interval: waits for an update"
    );

    clock.advance(secs(1));
    wait_for("the retry", || settled("broken", 2));
    let broken = periodic(MANAGER).into_iter().find(|e| e.name == "broken").unwrap();
    assert_eq!((broken.failures, broken.consecutive_failures), (2, 2));
    assert_eq!(broken.periodic().unwrap().next_run_in, Some(secs(2)), "linear backoff");

    let table = status::format_table(&periodic(MANAGER));
    assert!(table.starts_with("reconq status: 0 controllers, 2 periodic; 1 failing, 0 hanging\n"), "{table}");
    assert!(table.contains("status-manager/broken") && table.contains("status-manager/sync"), "{table}");

    manager.remove_all_and_wait();
    assert!(periodic(MANAGER).is_empty(), "removed controllers are not listed");
}

#[test]
fn entries_live_as_long_as_their_objects() {
    let listed = |name: &str| status::snapshot().iter().any(|e| e.name == name);

    let unstarted = Controller::new("status-unstarted", |_: &u8, _: &Context| -> Result<Action, ReconcileError> {
        Ok(Action::Done)
    });
    assert!(listed("status-unstarted"));
    drop(unstarted);
    // Another test's snapshot may hold a dropped object for a moment.
    wait_for("the unstarted controller to go", || !listed("status-unstarted"));

    let handle =
        Controller::new("status-dropped", |_: &u8, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .hanging_threshold(secs(60))
            .start();
    handle.enqueue(1);
    assert!(handle.wait_idle(PATIENCE));
    assert!(handle.stop_with_drain(PATIENCE));
    assert!(listed("status-dropped"), "a stopped controller is listed while a handle lives");
    let clone = handle.clone();
    drop(handle);
    assert!(listed("status-dropped"));
    drop(clone);
    wait_for("the controller to go with its last handle", || !listed("status-dropped"));

    let manager = Manager::builder().name("status-dropped-manager").build();
    let (ran, first_run) = mpsc::channel();
    manager.update(
        "status-dropped-job",
        ControllerParams::new(move || -> Result<(), DoError> {
            ran.send(()).ok();
            Ok(())
        }),
    );
    first_run.recv_timeout(PATIENCE).unwrap();
    assert!(listed("status-dropped-job"));
    drop(manager);
    wait_for("a dropped manager's controllers to go", || !listed("status-dropped-job"));
}

#[test]
fn an_entry_counts_held_keys_and_superseded_reconciles() {
    let name = "status_dependencies";
    let (h, gate) = parent_held_by_cancelled_child(name);
    let e = entry(name);
    let d = details(&e);
    assert_eq!((d.held, d.depth, d.processing, d.superseded), (1, 1, 1, 0), "the parent waits for the child");
    for _ in 0..3 {
        gate.release();
    }
    assert!(h.wait_idle(PATIENCE));
    let e = entry(name);
    let d = details(&e);
    assert_eq!((d.held, d.superseded, d.reconciles, e.successes), (0, 1, 3, 2), "the child's first run superseded");
    let json = status::to_json(std::slice::from_ref(&e));
    assert!(json.contains(r#""held":0"#) && json.contains(r#""superseded":1"#), "{json}");
}

/// Where each header starts in the table's header line.
fn column_starts(header: &str, names: &[&str]) -> Vec<usize> {
    names.iter().map(|n| header.find(n).unwrap_or_else(|| panic!("no column {n} in {header:?}"))).collect()
}

#[test]
fn the_table_aligns_its_columns() {
    let now = SystemTime::now();
    let controller = StatusEntry {
        name: "a-controller-with-a-long-name".into(),
        kind: EntryKind::Controller(ControllerDetails {
            state: RunState::Running,
            workers: 4,
            reconciles: 12345,
            requeues: 0,
            panics: 0,
            depth: 7,
            processing: 3,
            waiting: 100,
            parked: 0,
            hanging_threshold: None,
            hanging: Vec::new(),
            store: None,
            leader: None,
            shards: None,
            not_owned: 0,
            held: 0,
            superseded: 0,
        }),
        successes: 12000,
        failures: 345,
        consecutive_failures: 2,
        last_error: Some(format!("ValueError: {}\nTraceback (most recent call last): ...", "x".repeat(100))),
        last_error_time: Some(now - secs(30)),
        last_success_time: Some(now - secs(125)),
    };
    let job = StatusEntry {
        name: "gc".into(),
        kind: EntryKind::Periodic(PeriodicDetails {
            manager: "m".into(),
            running: true,
            leader: None,
            last_duration: None,
            next_run_in: None,
        }),
        successes: 1,
        failures: 0,
        consecutive_failures: 0,
        last_error: None,
        last_error_time: None,
        last_success_time: None,
    };
    let table = status::format_table(&[controller, job]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "summary, header, two rows:\n{table}");
    assert_eq!(lines[0], "reconq status: 1 controller, 1 periodic; 1 failing, 0 hanging");
    let columns = [
        "NAME",
        "KIND",
        "STATE",
        "SUCCESS",
        "FAIL",
        "CONSEC",
        "DEPTH",
        "PROC",
        "WAIT",
        "LAST SUCCESS",
        "LAST ERROR",
        "MESSAGE",
        "HANGING",
    ];
    let starts = column_starts(lines[1], &columns);
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "columns in order: {starts:?}");
    let rows = [
        [
            "a-controller-with-a-long-name",
            "controller",
            "running",
            "12000",
            "345",
            "2",
            "7",
            "3",
            "100",
            "2m5s ago",
            "30s ago",
            "ValueError: xxx",
            "-",
        ],
        ["m/gc", "periodic", "running", "1", "0", "0", "-", "-", "-", "never", "never", "-", "-"],
    ];
    for (line, cells) in lines[2..].iter().zip(rows) {
        for ((column, start), cell) in columns.iter().zip(&starts).zip(cells) {
            assert!(
                line[*start..].starts_with(cell),
                "column {column} of {line:?} should start with {cell:?}\n{table}"
            );
            if *start > 0 {
                assert_eq!(&line[start - 2..*start], "  ", "two spaces before {column} in {line:?}");
            }
        }
    }
    let message_start = starts[11];
    let message = lines[2][message_start..starts[12]].trim_end();
    assert_eq!(message.chars().count(), 60, "cut to 60 characters: {message:?}");
    assert!(message.ends_with("..."), "{message:?}");
    assert!(!table.contains("Traceback"), "only the first line of a message");
}

/// `Stats` and the status entry say the same under the same names, and
/// `Stats::background_threads` is what the handle counts (a watchdog
/// thread with a hanging threshold).
#[test]
fn stats_and_the_entry_share_their_counters() {
    const NAME: &str = "status-shared-counters";
    let h = Controller::new(NAME, |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        match (key, ctx.attempt()) {
            (0, 0) => panic!("kaboom"),
            _ => Ok(Action::Done),
        }
    })
    .hanging_threshold(secs(3600))
    .start();
    h.enqueue(0);
    h.enqueue(1);
    assert!(h.wait_idle(PATIENCE));
    let stats = h.stats();
    let e = entry(NAME);
    let d = details(&e);
    assert_eq!((stats.reconciles, stats.successes, stats.failures, stats.panics), (3, 2, 1, 1), "{stats:?}");
    assert_eq!((d.reconciles, e.successes, e.failures, d.panics), (3, 2, 1, 1), "{e:?}");
    assert_eq!((e.last_error.as_deref(), e.last_error_time), (stats.last_error.as_deref(), stats.last_error_time));
    assert_eq!(stats.background_threads, h.background_threads());
    assert_eq!(stats.background_threads, 1, "the watchdog");
    assert!(h.stop_with_drain(PATIENCE));
    wait_for("the watchdog to exit", || h.stats().background_threads == 0);
}
