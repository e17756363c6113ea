//! The engine's `tracing` spans and events, captured with exact content.
//!
//! Each test gets its own capturing subscriber, installed on the engine's
//! threads through the controller's (or manager's) thread wrapper and on the
//! test thread with `with_default`, so tests running in parallel never see
//! each other's events.

mod common;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reconq::{
    Action, Context, Controller, ControllerHandle, ControllerParams, DoError, ExponentialBackoff, FakeClock, Manager,
    ReconcileError, ThreadWrapper,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use common::{Gate, PATIENCE, ms};

type Res = Result<Action, ReconcileError>;
type Fields = BTreeMap<String, String>;

/// One captured event: level, target, message, its own fields, and the
/// spans it was emitted in (outermost first) with their fields.
#[derive(Debug, Clone, PartialEq)]
struct Captured {
    level: Level,
    target: String,
    message: String,
    fields: Fields,
    spans: Vec<(String, Fields)>,
}

/// Records every field as a string: `Debug` for `?x`/`%x` values, the
/// plain text for strings, the number for integers and floats.
#[derive(Default, Clone)]
struct FieldMap(Fields);

impl Visit for FieldMap {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

struct Capture(Arc<Mutex<Vec<Captured>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let mut fields = FieldMap::default();
        attrs.record(&mut fields);
        ctx.span(id).expect("a new span exists").extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: LayerContext<'_, S>) {
        let span = ctx.span(id).expect("a recorded span exists");
        let mut ext = span.extensions_mut();
        if let Some(fields) = ext.get_mut::<FieldMap>() {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: LayerContext<'_, S>) {
        let mut fields = FieldMap::default();
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = fields.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| {
                        let fields = span.extensions().get::<FieldMap>().cloned().unwrap_or_default();
                        (span.name().to_owned(), fields.0)
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.lock().push(Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message,
            fields,
            spans,
        });
    }
}

/// A capturing subscriber, and a thread wrapper that installs it on every
/// engine thread.
struct Logs {
    dispatch: Dispatch,
    events: Arc<Mutex<Vec<Captured>>>,
}

impl Logs {
    fn new() -> Self {
        let events = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&events)));
        Self { dispatch: Dispatch::new(subscriber), events }
    }

    fn wrapper(&self) -> ThreadWrapper {
        let dispatch = self.dispatch.clone();
        Arc::new(move |body: &mut dyn FnMut()| tracing::dispatcher::with_default(&dispatch, body))
    }

    /// The events on `target`, in the order they were emitted.
    fn on(&self, target: &str) -> Vec<Captured> {
        self.events.lock().iter().filter(|e| e.target == target).cloned().collect()
    }

    /// Waits until `n` events on `target` were captured; returns them.
    fn wait_for(&self, target: &str, n: usize) -> Vec<Captured> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let found = self.on(target);
            if found.len() >= n {
                return found;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {n} events on {target}: {found:#?}");
            std::thread::sleep(ms(2));
        }
    }
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn reconcile_span(controller: &str, key: &str, attempt: u32) -> Vec<(String, Fields)> {
    vec![(
        "reconcile".to_owned(),
        fields(&[("controller", controller), ("key", key), ("attempt", &attempt.to_string())]),
    )]
}

fn fast_retries<K: Eq + std::hash::Hash + Clone + Send + Sync>() -> ExponentialBackoff<K> {
    ExponentialBackoff::new(ms(1), ms(1))
}

/// Runs a controller named `name` logging into `logs`, with 1 ms retries,
/// until key "web" went through `reconcile` to its end; returns its
/// stopped handle.
fn reconcile_web_until_done(
    logs: &Logs,
    name: &str,
    reconcile: impl Fn(&String, &Context) -> Res + Send + Sync + 'static,
) -> reconq::ControllerHandle<String> {
    let h = Controller::new(name, reconcile).rate_limiter(fast_retries()).thread_wrapper(logs.wrapper()).start();
    h.enqueue("web".to_string());
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    h
}

#[test]
fn events_in_a_reconcile_carry_controller_key_and_attempt() {
    let logs = Logs::new();
    reconcile_web_until_done(&logs, "logs-attempts", |_key: &String, ctx: &Context| -> Res {
        tracing::info!(target: "user", "inside");
        if ctx.attempt() < 2 { Err(ReconcileError::new("flaky backend")) } else { Ok(Action::Done) }
    });

    let user: Vec<_> = logs.on("user");
    let expected: Vec<Captured> = (0..3)
        .map(|attempt| Captured {
            level: Level::INFO,
            target: "user".into(),
            message: "inside".into(),
            fields: Fields::new(),
            spans: reconcile_span("logs-attempts", "\"web\"", attempt),
        })
        .collect();
    assert_eq!(user, expected);

    // The engine's own failure events: ERROR, in the span, and with the
    // context as fields too (for `log` records, which have no spans); the
    // same error again is a WARN.
    let engine = logs.on("reconq::controller");
    let expected: Vec<Captured> = (0..2)
        .map(|attempt| Captured {
            level: if attempt == 0 { Level::ERROR } else { Level::WARN },
            target: "reconq::controller".into(),
            message: if attempt == 0 {
                "reconcile failed; retrying with backoff".into()
            } else {
                "reconcile failed again with the same error".into()
            },
            fields: fields(&[
                ("controller", "logs-attempts"),
                ("key", "\"web\""),
                ("attempt", &attempt.to_string()),
                ("error", "flaky backend"),
            ]),
            spans: reconcile_span("logs-attempts", "\"web\"", attempt),
        })
        .collect();
    assert_eq!(engine, expected);
}

#[test]
fn a_key_failing_again_and_again_is_an_error_once_then_quieter_and_a_new_error_is_an_error_again() {
    let logs = Logs::new();
    let h = reconcile_web_until_done(&logs, "logs-repeats", |_key: &String, ctx: &Context| -> Res {
        match ctx.attempt() {
            0..9 => Err(ReconcileError::new("backend down")),
            9 => Err(ReconcileError::new("backend refused")),
            _ => Ok(Action::Done),
        }
    });
    let levels: Vec<(Level, String)> = logs
        .on("reconq::controller")
        .into_iter()
        .map(|e| (e.level, e.fields["attempt"].clone() + " " + &e.fields["error"]))
        .collect();
    let expect = |level, attempt: u32, error: &str| (level, format!("{attempt} {error}"));
    let mut expected = vec![expect(Level::ERROR, 0, "backend down")];
    for attempt in 1..9u32 {
        let level = if attempt.is_power_of_two() { Level::WARN } else { Level::DEBUG };
        expected.push(expect(level, attempt, "backend down"));
    }
    expected.push(expect(Level::ERROR, 9, "backend refused"));
    assert_eq!(levels, expected);
    assert_eq!(h.stats().failures, 10, "the counters count every failure");
}

#[test]
fn a_huge_key_and_a_long_key_list_make_short_log_lines() {
    let logs = Logs::new();
    let huge = "k".repeat(1 << 20);
    let h = Controller::new("logs-huge", |_key: &String, _: &Context| -> Res { Err(ReconcileError::new("down")) })
        .rate_limiter(ExponentialBackoff::new(Duration::from_secs(3600), Duration::from_secs(3600)))
        .thread_wrapper(logs.wrapper())
        .start();
    h.enqueue(huge.clone());
    for k in 0..100 {
        h.enqueue(k.to_string());
    }
    logs.wait_for("reconq::controller", 101);
    assert!(tracing::dispatcher::with_default(&logs.dispatch, || h.stop_with_drain(PATIENCE)));
    let events = logs.on("reconq::controller");
    let failed = events.iter().find(|e| e.fields["key"].starts_with("\"kkk")).expect("the huge key's failure");
    assert!(failed.fields["key"].len() < 400 && failed.fields["key"].ends_with("…[truncated]"), "{:?}", failed.fields);
    let dropped = events.iter().find(|e| e.fields.contains_key("dropped")).expect("the stop's dropped keys");
    assert_eq!(dropped.fields["dropped"], "101");
    assert!(dropped.fields["keys"].len() < 2000 && dropped.fields["keys"].ends_with("(81 more)]"), "{dropped:?}");
}

#[test]
fn a_panic_is_an_error_with_its_context() {
    let logs = Logs::new();
    let h = Controller::new("logs-panic", |_key: &u32, ctx: &Context| -> Res {
        if ctx.attempt() == 0 {
            panic!("boom");
        }
        Ok(Action::Done)
    })
    .rate_limiter(fast_retries())
    .thread_wrapper(logs.wrapper())
    .start();
    h.enqueue(7);
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    assert_eq!(
        logs.on("reconq::controller"),
        [Captured {
            level: Level::ERROR,
            target: "reconq::controller".into(),
            message: "reconcile panicked; retrying with backoff".into(),
            fields: fields(&[("controller", "logs-panic"), ("key", "7"), ("attempt", "0"), ("error", "boom")]),
            spans: reconcile_span("logs-panic", "7", 0),
        }]
    );
}

#[test]
fn retry_after_is_a_warning_and_permanent_an_error() {
    let logs = Logs::new();
    let h = Controller::new("logs-kinds", |key: &&'static str, ctx: &Context| -> Res {
        match (*key, ctx.attempt()) {
            ("later", 0) => Err(ReconcileError::retry_after(ms(1), "busy")),
            ("never", _) => Err(ReconcileError::permanent("invalid spec")),
            _ => Ok(Action::Done),
        }
    })
    .rate_limiter(fast_retries())
    .thread_wrapper(logs.wrapper())
    .start();
    h.enqueue("later");
    assert!(h.wait_idle(PATIENCE));
    h.enqueue("never");
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    let got: Vec<_> = logs.on("reconq::controller").into_iter().map(|e| (e.level, e.message, e.fields)).collect();
    assert_eq!(
        got,
        [
            (
                Level::WARN,
                "reconcile failed; retrying after a delay".to_owned(),
                fields(&[
                    ("controller", "logs-kinds"),
                    ("key", "\"later\""),
                    ("attempt", "0"),
                    ("error", "busy"),
                    ("retry_after", "1ms"),
                ]),
            ),
            (
                Level::ERROR,
                "reconcile failed permanently; key parked".to_owned(),
                fields(&[
                    ("controller", "logs-kinds"),
                    ("key", "\"never\""),
                    ("attempt", "0"),
                    ("error", "invalid spec"),
                ]),
            ),
        ]
    );
}

#[test]
fn successes_and_requeues_log_nothing() {
    let logs = Logs::new();
    let seen = Mutex::new(std::collections::HashSet::new());
    let h = Controller::new("logs-quiet", move |key: &u32, _: &Context| -> Res {
        // The first run of 1 and 2 requeues; every other run succeeds.
        let first = seen.lock().insert(*key);
        match (*key, first) {
            (1, true) => Ok(Action::Requeue),
            (2, true) => Ok(Action::RequeueAfter(ms(1))),
            _ => Ok(Action::Done),
        }
    })
    .rate_limiter(fast_retries())
    .thread_wrapper(logs.wrapper())
    .start();
    for key in 0..3 {
        h.enqueue(key);
    }
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    assert_eq!(h.stats().reconciles, 5);
    assert_eq!(logs.on("reconq::controller"), []);
}

#[test]
fn a_hanging_reconcile_is_a_warning_naming_controller_and_key() {
    let logs = Logs::new();
    let clock = FakeClock::new();
    let gate = Gate::new();
    let h = Controller::new("logs-hang", gate.reconcile::<String>())
        .clock(clock.clone())
        .hanging_threshold(Duration::from_secs(1))
        .thread_wrapper(logs.wrapper())
        .start();
    h.enqueue("stuck".to_string());
    gate.wait_arrivals(1);
    clock.advance(Duration::from_millis(2500));
    let events = logs.wait_for("reconq::controller", 1);
    assert_eq!(
        events,
        [Captured {
            level: Level::WARN,
            target: "reconq::controller".into(),
            message: "reconcile has been running for 2.5 s".into(),
            fields: fields(&[("controller", "logs-hang"), ("key", "\"stuck\""), ("seconds", "2.5")]),
            spans: vec![],
        }]
    );
    gate.release();
    assert!(h.stop_with_drain(PATIENCE));
    assert_eq!(logs.on("reconq::controller").len(), 1, "each hang is logged once");
}

/// Controller `name`, logging to `logs`, whose reconciles wait at the gate
/// returned with it.
fn gated_controller(name: &str, logs: &Logs) -> (ControllerHandle<u32>, Gate) {
    let gate = Gate::new();
    (Controller::new(name, gate.reconcile()).thread_wrapper(logs.wrapper()).start(), gate)
}

#[test]
fn a_drain_deadline_is_a_warning_listing_the_unfinished_keys() {
    let logs = Logs::new();
    let (h, gate) = gated_controller("logs-drain", &logs);
    h.enqueue(42);
    gate.wait_arrivals(1);
    let finished = tracing::dispatcher::with_default(&logs.dispatch, || h.stop_with_drain(ms(10)));
    assert!(!finished);
    gate.release();
    assert_eq!(
        logs.on("reconq::controller"),
        [Captured {
            level: Level::WARN,
            target: "reconq::controller".into(),
            message: "drain deadline passed; cancelled and detached the workers still running".into(),
            fields: fields(&[("controller", "logs-drain"), ("unfinished", "[42]")]),
            spans: vec![],
        }]
    );
}

#[test]
fn trigger_and_watch_panics_are_errors() {
    let logs = Logs::new();
    let h = Controller::new("logs-sources", |_key: &u32, _: &Context| -> Res { Ok(Action::Done) })
        .thread_wrapper(logs.wrapper())
        .start();
    h.add_trigger(5, |_stop| -> bool { panic!("trigger broke") });
    logs.wait_for("reconq::controller", 1);
    h.watch([1u32], |_event| -> Vec<u32> { panic!("transform broke") });
    let events = logs.wait_for("reconq::controller", 2);
    assert!(h.stop_with_drain(PATIENCE));
    let got: Vec<_> = events.into_iter().map(|e| (e.level, e.message, e.fields)).collect();
    assert_eq!(
        got,
        [
            (
                Level::ERROR,
                "trigger panicked".to_owned(),
                fields(&[("controller", "logs-sources"), ("key", "5"), ("error", "trigger broke")]),
            ),
            (
                Level::ERROR,
                "watch transform panicked; event skipped".to_owned(),
                fields(&[("controller", "logs-sources"), ("error", "transform broke")]),
            ),
        ]
    );
}

#[test]
fn manager_runs_have_a_span_and_failures_are_logged() {
    let logs = Logs::new();
    let manager = Manager::builder().name("logs-jobs").thread_wrapper(logs.wrapper()).build();
    let (ran, runs) = mpsc::channel::<u32>();
    let calls = Arc::new(Mutex::new(0u32));
    manager.update(
        "logs-sync",
        ControllerParams::new(move || -> Result<(), DoError> {
            let n = {
                let mut calls = calls.lock();
                *calls += 1;
                *calls
            };
            tracing::info!(target: "user", n, "syncing");
            ran.send(n).ok();
            match n {
                1 => Err(DoError::new("no route")),
                2 => panic!("do broke"),
                _ => Ok(()),
            }
        })
        .error_retry_base(ms(1))
        .stop(|| panic!("stop broke")),
    );
    for expected in 1..=3 {
        assert_eq!(runs.recv_timeout(PATIENCE).unwrap(), expected);
    }
    manager.remove_all_and_wait();

    let run_span = vec![("run".to_owned(), fields(&[("manager", "logs-jobs"), ("controller", "logs-sync")]))];
    let user: Vec<_> = logs.on("user").into_iter().map(|e| (e.fields, e.spans)).collect();
    let expected: Vec<_> = (1..=3).map(|n| (fields(&[("n", &n.to_string())]), run_span.clone())).collect();
    assert_eq!(user, expected);

    assert_eq!(
        logs.on("reconq::manager"),
        [
            Captured {
                level: Level::WARN,
                target: "reconq::manager".into(),
                message: "do failed".into(),
                fields: fields(&[
                    ("manager", "logs-jobs"),
                    ("controller", "logs-sync"),
                    ("consecutive_failures", "1"),
                    ("retry_in", "Some(1ms)"),
                    ("error", "no route"),
                ]),
                spans: run_span.clone(),
            },
            Captured {
                level: Level::ERROR,
                target: "reconq::manager".into(),
                message: "do panicked".into(),
                fields: fields(&[
                    ("manager", "logs-jobs"),
                    ("controller", "logs-sync"),
                    ("consecutive_failures", "2"),
                    ("retry_in", "Some(2ms)"),
                    ("error", "panicked: do broke"),
                ]),
                spans: run_span,
            },
            Captured {
                level: Level::ERROR,
                target: "reconq::manager".into(),
                message: "stop panicked".into(),
                fields: fields(&[
                    ("manager", "logs-jobs"),
                    ("controller", "logs-sync"),
                    ("error", "panicked: stop broke")
                ]),
                spans: vec![],
            },
        ]
    );
}

#[test]
fn a_stop_that_drops_keys_is_a_warning_with_their_count() {
    let logs = Logs::new();
    let gate = Gate::new();
    let g = gate.clone();
    let h = Controller::new("logs-drop", move |key: &u32, _: &Context| -> Res {
        if *key == 0 {
            g.pass();
        }
        Ok(Action::Done)
    })
    .thread_wrapper(logs.wrapper())
    .start();
    h.enqueue(0);
    common::wait_for("key 0 to run", || h.stats().processing == 1);
    h.enqueue(1);
    h.enqueue_after(2, Duration::from_secs(3600));
    tracing::dispatcher::with_default(&logs.dispatch, || h.stop());
    gate.release();
    let warning = logs.on("reconq::controller").pop().expect("a warning");
    assert_eq!((warning.level, warning.fields["dropped"].as_str()), (Level::WARN, "2"), "{warning:#?}");
    assert!(warning.message.starts_with("stop dropped keys"), "{warning:#?}");
    let keys = &warning.fields["keys"];
    assert!(keys == "[1, 2]" || keys == "[2, 1]", "{keys}");
}

#[test]
fn a_stop_held_up_by_a_reconcile_names_it_every_few_seconds() {
    let logs = Logs::new();
    let (h, gate) = gated_controller("logs-stop-wait", &logs);
    h.enqueue(7);
    common::wait_for("key 7 to run", || h.stats().processing == 1);
    let stopper = {
        let (h, dispatch) = (h.clone(), logs.dispatch.clone());
        std::thread::spawn(move || tracing::dispatcher::with_default(&dispatch, || h.stop_with_drain(PATIENCE)))
    };
    let waiting = logs.wait_for("reconq::controller", 1);
    gate.release();
    assert!(stopper.join().unwrap(), "the drain finished once released");
    assert_eq!(
        waiting[0],
        Captured {
            level: Level::WARN,
            target: "reconq::controller".into(),
            message: "stop waiting for reconciles to return".into(),
            fields: fields(&[("controller", "logs-stop-wait"), ("running", "[7]")]),
            spans: vec![],
        }
    );
}

/// C3's error path: a panicking `partition_by` is an ERROR naming the key
/// (again only at the 2nd, 4th, ... failure), and the key is partitioned
/// by itself (here, by C4's check of an edge, which asks the same
/// function the sharding gate does).
#[cfg(feature = "etcd")]
#[test]
fn a_failing_partition_by_is_an_error_naming_the_key_partitioned_by_itself() {
    let logs = Logs::new();
    let partitions = 64;
    let c = Controller::new("logs-partition-by", |_: &String, _: &Context| -> Res { Ok(Action::Done) })
        .sharding(reconq::Sharding::new("http://127.0.0.1:1", "logs-partition-by").partitions(partitions))
        .partition_by(
            |key: &String| if key.starts_with("bad") { panic!("no pipeline for {key}") } else { "p".to_string() },
        );
    let h = c.handle();
    let (key, bad) = ("ok".to_string(), "bad-1".to_string());
    let refused = tracing::dispatcher::with_default(&logs.dispatch, || h.set_dependencies(&key, [bad.clone()]));
    let Err(reconq::DependencyError::CrossPartition(e)) = refused else { panic!("{refused:?}") };
    assert_eq!(e.key_partition, reconq::partition_of(&"p".to_string(), partitions));
    assert_eq!(e.parent_partition, reconq::partition_of(&bad, partitions), "partitioned by itself");
    let errors = logs.on("reconq::controller");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].level, Level::ERROR);
    assert_eq!(errors[0].message, "partition_by failed; the key is partitioned by itself");
    assert_eq!(errors[0].fields["key"], "\"bad-1\"");
    assert!(errors[0].fields["error"].contains("no pipeline for bad-1"), "{errors:#?}");
    // Rate-limited: failures 2 and 4 are logged, 3 is not.
    for n in 2..=4 {
        let bad = format!("bad-{n}");
        let _ = tracing::dispatcher::with_default(&logs.dispatch, || h.set_dependencies(&key, [bad]));
    }
    let logged: Vec<String> = logs.on("reconq::controller").iter().map(|e| e.fields["key"].clone()).collect();
    assert_eq!(logged, ["\"bad-1\"", "\"bad-2\"", "\"bad-4\""]);
}
