//! Metrics (issue 6): exact values after known sequences, read back by
//! parsing `reconq::metrics::render()` as a scraper would; the `metrics`
//! facade bridge; the HTTP endpoint.
//!
//! Metric names are global and tests run in parallel, so every test uses
//! its own queue and controller names.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use common::{Gate, PATIENCE, ms, parent_held_by_cancelled_child, secs, wait_for};
use parking_lot::Mutex;
use reconq::{Action, Context, Controller, ExponentialBackoff, FakeClock, ReconcileError, WorkQueue};

/// Label names and values, sorted.
type Labels = Vec<(String, String)>;

/// One parsed exposition: `(metric name, sorted labels) -> value`.
type Samples = BTreeMap<(String, Labels), f64>;

/// Parses the Prometheus text format strictly enough to catch mistakes:
/// every sample's family has `# HELP` and `# TYPE` lines before it, no
/// series appears twice, and histograms are cumulative with `+Inf` equal to
/// `_count`.
fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.push(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helped.last().is_some_and(|h| h == name), "# TYPE {name} without # HELP just before");
            assert!(types.insert(name.to_owned(), kind.to_owned()).is_none(), "family {name} twice");
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "unexpected line {line:?}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').expect("closing brace"))),
            None => (series, Vec::new()),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample {name} before its # TYPE");
        let mut labels = labels;
        labels.sort();
        assert!(samples.insert((name.to_owned(), labels), value).is_none(), "duplicate series in {line:?}");
    }
    check_histograms(&samples, &types);
    samples
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut chars = s.chars().peekable();
    while chars.peek().is_some() {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'));
        let mut value = String::new();
        loop {
            match chars.next().expect("unterminated label value") {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c @ ('\\' | '"')) => value.push(c),
                    other => panic!("bad escape {other:?}"),
                },
                c => value.push(c),
            }
        }
        labels.push((name, value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

fn check_histograms(samples: &Samples, types: &HashMap<String, String>) {
    for (family, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        let bucket = format!("{family}_bucket");
        let mut by_series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        for ((name, labels), value) in samples {
            if *name == bucket {
                let le = labels.iter().find(|(k, _)| k == "le").expect("le label").1.clone();
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                let rest: Vec<_> = labels.iter().filter(|(k, _)| k != "le").cloned().collect();
                by_series.entry(rest).or_default().push((le, *value));
            }
        }
        for (labels, mut buckets) in by_series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{family}{labels:?} not cumulative: {buckets:?}");
            let inf = buckets.last().unwrap();
            assert_eq!(inf.0, f64::INFINITY);
            let count = samples[&(format!("{family}_count"), labels.clone())];
            assert_eq!(inf.1, count, "{family}{labels:?}: +Inf bucket != _count");
            assert!(samples.contains_key(&(format!("{family}_sum"), labels)));
        }
    }
}

fn scrape() -> Samples {
    parse(&reconq::metrics::render())
}

/// The value of `name` with exactly `labels`, if present.
fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut labels: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    labels.sort();
    samples.get(&(name.to_owned(), labels)).copied()
}

fn get(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(samples, name, labels).unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
}

/// The labels of queue `name`'s series, as controller-runtime labels them:
/// `name`, and `controller` (the same name).
fn queue(name: &str) -> [(&str, &str); 2] {
    [("name", name), ("controller", name)]
}

/// The labels of queue `name`'s depth at `priority`.
fn depth_at<'a>(name: &'a str, priority: &'a str) -> [(&'a str, &'a str); 3] {
    [("name", name), ("controller", name), ("priority", priority)]
}

/// The queue metrics of `name` that count things: adds, depth (of
/// priority 0, the only one used), retries, queue-duration count,
/// work-duration count.
fn queue_counts(name: &str) -> (f64, f64, f64, f64, f64) {
    let s = scrape();
    let l = queue(name);
    (
        get(&s, "workqueue_adds_total", &l),
        get(&s, "workqueue_depth", &depth_at(name, "0")),
        get(&s, "workqueue_retries_total", &l),
        get(&s, "workqueue_queue_duration_seconds_count", &l),
        get(&s, "workqueue_work_duration_seconds_count", &l),
    )
}

fn processing_gauges(name: &str) -> (f64, f64) {
    let s = scrape();
    (
        get(&s, "workqueue_unfinished_work_seconds", &queue(name)),
        get(&s, "workqueue_longest_running_processor_seconds", &queue(name)),
    )
}

#[test]
fn named_queue_counts_adds_retries_and_durations_like_client_go() {
    let name = "t_queue_sequence";
    let clock = FakeClock::new();
    let q = WorkQueue::<&str>::builder().name(name).clock(clock.clone()).build();
    assert_eq!(queue_counts(name), (0.0, 0.0, 0.0, 0.0, 0.0));

    q.add("a");
    q.add("a"); // deduplicated: not an add
    q.add("b");
    assert_eq!(queue_counts(name), (2.0, 2.0, 0.0, 0.0, 0.0));

    assert_eq!(q.get(), Some("a"));
    assert_eq!(queue_counts(name), (2.0, 1.0, 0.0, 1.0, 0.0));
    q.add("a"); // dirty while processing: an add, and part of the depth
    q.add("a");
    assert_eq!(queue_counts(name), (3.0, 2.0, 0.0, 1.0, 0.0));
    q.done(&"a"); // ready again: the same add
    assert_eq!(queue_counts(name), (3.0, 2.0, 0.0, 1.0, 1.0));

    q.add_after("c", secs(10)); // a retry; not an add until due
    q.add_rate_limited("d"); // a retry (5 ms on the fake clock: not due)
    q.add_after("a", secs(10)); // a retry; "a" is ready, nothing changes
    assert_eq!(queue_counts(name), (3.0, 2.0, 3.0, 1.0, 1.0));

    let (a, b) = (q.get().unwrap(), q.get().unwrap());
    assert_eq!((a, b), ("b", "a"));
    assert_eq!(queue_counts(name), (3.0, 0.0, 3.0, 3.0, 1.0));
    // Two keys in flight: unfinished work and the longest runner grow
    // (real time: the fake clock moves due times, not durations).
    wait_for("unfinished work to show", || {
        let (unfinished, longest) = processing_gauges(name);
        longest > 0.0 && unfinished > longest
    });
    q.done(&a);
    q.done(&b);
    assert_eq!(processing_gauges(name), (0.0, 0.0));
    assert_eq!(queue_counts(name), (3.0, 0.0, 3.0, 3.0, 3.0));

    clock.advance(secs(10)); // c and d become ready: two adds
    assert_eq!(queue_counts(name), (5.0, 2.0, 3.0, 3.0, 3.0));
    q.add_after("e", Duration::ZERO); // a zero delay is an add, and still a retry
    assert_eq!(queue_counts(name), (6.0, 3.0, 4.0, 3.0, 3.0));

    q.shut_down();
    q.add("f");
    q.add_after("f", secs(1));
    assert_eq!(queue_counts(name), (6.0, 3.0, 4.0, 3.0, 3.0), "nothing counts after shutdown");
    while let Some(k) = q.get() {
        q.done(&k);
    }
    assert_eq!(queue_counts(name), (6.0, 0.0, 4.0, 6.0, 6.0));
}

#[test]
fn histograms_have_client_go_buckets_and_measure_real_time() {
    let name = "t_queue_buckets";
    let q = WorkQueue::<u32>::builder().name(name).build();
    q.add(1);
    std::thread::sleep(ms(20)); // the key waits at least 20 ms
    let key = q.get().unwrap();
    q.done(&key);
    let text = reconq::metrics::render();
    let les: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with(&format!("workqueue_queue_duration_seconds_bucket{{name=\"{name}\",controller=\"{name}\""))
        })
        .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(
        les,
        [
            "1e-08",
            "1e-07",
            "1e-06",
            "9.999999999999999e-06",
            "9.999999999999999e-05",
            "0.001",
            "0.01",
            "0.1",
            "1",
            "10",
            "+Inf"
        ]
    );
    let s = parse(&text);
    let l = |le: &'static str| [("name", name), ("controller", name), ("le", le)];
    assert_eq!(get(&s, "workqueue_queue_duration_seconds_bucket", &l("0.01")), 0.0, "waited >= 20 ms");
    assert_eq!(get(&s, "workqueue_queue_duration_seconds_bucket", &l("+Inf")), 1.0);
    let sum = get(&s, "workqueue_queue_duration_seconds_sum", &queue(name));
    assert!((0.019..PATIENCE.as_secs_f64()).contains(&sum), "queue duration {sum} s");
}

/// The `workqueue_*` families of queue `name` in `samples`, each with the
/// label names of its series (without histograms' `le`).
fn workqueue_label_names(samples: &Samples, name: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut families: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    for (metric, labels) in samples.keys() {
        if metric.starts_with("workqueue_") && labels.iter().any(|(k, v)| k == "name" && v == name) {
            let names = labels.iter().map(|(k, _)| k.clone()).filter(|k| k != "le").collect();
            families.entry(metric.clone()).or_default().push(names);
        }
    }
    families
}

#[test]
fn workqueue_series_carry_controller_runtime_labels() {
    let name = "t_queue_labels";
    let q = WorkQueue::<&str>::builder().name(name).build();
    q.add_with_priority("high", 10);
    q.add_with_priority("also-high", 10);
    q.add("plain");
    q.add_with_priority("low", -1);
    let s = scrape();
    let families = workqueue_label_names(&s, name);
    assert_eq!(families.len(), 11, "every workqueue_* sample (histograms' _bucket, _sum, _count): {families:?}");
    for (family, series) in &families {
        for labels in series {
            let expected = if family == "workqueue_depth" {
                ["controller", "name", "priority"].as_slice()
            } else {
                ["controller", "name"].as_slice()
            };
            assert_eq!(labels, expected, "{family}");
        }
    }
    assert_eq!(get(&s, "workqueue_adds_total", &[("name", name), ("controller", name)]), 4.0);
    assert_eq!(get(&s, "workqueue_depth", &depth_at(name, "10")), 2.0);
    assert_eq!(get(&s, "workqueue_depth", &depth_at(name, "0")), 1.0);
    assert_eq!(get(&s, "workqueue_depth", &depth_at(name, "-1")), 1.0);
    let key = q.get().unwrap();
    q.add_with_priority(key, 3); // being processed, back at 3 after done
    let s = scrape();
    assert_eq!(get(&s, "workqueue_depth", &depth_at(name, "10")), 1.0);
    assert_eq!(get(&s, "workqueue_depth", &depth_at(name, "3")), 1.0, "{key} comes back at 3");
    q.done(&key);
    for _ in 0..4 {
        // The three others, and the first again (`get` waits when empty).
        let key = q.get().unwrap();
        q.done(&key);
    }
    let s = scrape();
    assert_eq!(get(&s, "workqueue_depth", &depth_at(name, "0")), 0.0, "priority 0's series stays");
    assert_eq!(value(&s, "workqueue_depth", &depth_at(name, "10")), None, "drained priorities leave");
}

#[test]
fn a_controllers_queue_is_labelled_with_its_name_as_the_controller() {
    let name = "t_ctl_queue_labels";
    let h = Controller::new(name, scripted(CallCounts::default())).workers(1).start();
    h.enqueue("s1".to_owned());
    assert!(h.wait_idle(PATIENCE));
    let s = scrape();
    assert_eq!(get(&s, "workqueue_adds_total", &[("name", name), ("controller", name)]), 1.0);
    assert_eq!(get(&s, "workqueue_work_duration_seconds_count", &[("name", name), ("controller", name)]), 1.0);
    assert_eq!(get(&s, "controller_runtime_reconcile_total", &[("controller", name), ("result", "success")]), 1.0);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn label_values_are_escaped() {
    let name = "t_queue \"quoted\" \\ back\nslash";
    let q = WorkQueue::<u32>::builder().name(name).build();
    q.add(7);
    assert!(reconq::metrics::render().contains(
        r#"workqueue_adds_total{name="t_queue \"quoted\" \\ back\nslash",controller="t_queue \"quoted\" \\ back\nslash"} 1"#
    ));
    assert_eq!(get(&scrape(), "workqueue_adds_total", &queue(name)), 1.0);
}

#[test]
fn dropped_queues_disappear() {
    let name = "t_queue_dropped";
    let q = WorkQueue::<u32>::builder().name(name).build();
    q.add(1);
    assert_eq!(value(&scrape(), "workqueue_depth", &depth_at(name, "0")), Some(1.0));
    drop(q);
    // A scrape running meanwhile in another test holds every live queue for
    // its duration, so the dropped queue may outlive `drop` by that long.
    wait_for("the dropped queue's series to disappear", || {
        value(&scrape(), "workqueue_depth", &depth_at(name, "0")).is_none()
    });
}

/// Calls per key, so each key can follow its own script.
#[derive(Clone, Default)]
struct CallCounts(Arc<Mutex<HashMap<String, u32>>>);

impl CallCounts {
    fn next(&self, key: &str) -> u32 {
        let mut calls = self.0.lock();
        let n = calls.entry(key.to_owned()).or_default();
        *n += 1;
        *n
    }
}

/// First call of each key: `s*` succeed, `e*` fail, `p*` fail permanently,
/// `x*` panic, `r*` requeue, `a*` requeue after 5 s. Later calls succeed.
fn scripted(calls: CallCounts) -> impl Fn(&String, &Context) -> Result<Action, ReconcileError> + Send + Sync {
    move |key: &String, _ctx: &Context| {
        if calls.next(key) > 1 {
            return Ok(Action::Done);
        }
        match &key[..1] {
            "e" => Err(ReconcileError::new("boom")),
            "p" => Err(ReconcileError::permanent("never")),
            "x" => panic!("reconcile panicked on purpose"),
            "r" => Ok(Action::Requeue),
            "a" => Ok(Action::RequeueAfter(secs(5))),
            _ => Ok(Action::Done),
        }
    }
}

/// Controller `name`'s value of `metric`, scraped now.
fn controller_value(metric: &str, name: &str) -> f64 {
    get(&scrape(), metric, &[("controller", name)])
}

fn controller_counts(name: &str) -> [f64; 9] {
    let s = scrape();
    let c = [("controller", name)];
    let result = |r| get(&s, "controller_runtime_reconcile_total", &[("controller", name), ("result", r)]);
    [
        result("success"),
        result("error"),
        result("requeue"),
        result("requeue_after"),
        get(&s, "controller_runtime_reconcile_errors_total", &c),
        get(&s, "controller_runtime_terminal_reconcile_errors_total", &c),
        get(&s, "controller_runtime_reconcile_panics_total", &c),
        get(&s, "controller_runtime_reconcile_time_seconds_count", &c),
        get(&s, "controller_runtime_active_workers", &c),
    ]
}

#[test]
fn controller_counts_results_like_controller_runtime() {
    let name = "t_ctl_results";
    let clock = FakeClock::new();
    let calls = CallCounts::default();
    let controller = Controller::new(name, scripted(calls.clone()))
        .workers(2)
        .clock(clock.clone())
        .rate_limiter(ExponentialBackoff::new(secs(1), secs(100)));
    let handle = controller.handle();
    assert_eq!(controller_value("controller_runtime_max_concurrent_reconciles", name), 2.0);
    assert_eq!(controller_counts(name), [0.0; 9], "listed, all zero, before start");
    let handle2 = controller.start();
    for key in ["s1", "s2", "s3", "e1", "p1", "x1", "r1", "a1"] {
        handle.enqueue(key.to_owned());
    }
    // First round: 8 reconciles; e1, x1, r1 and a1 wait for the fake clock.
    // (A reconcile is in the metrics just after `stats()` counts it.)
    wait_for("the first round", || controller_counts(name)[7] == 8.0);
    wait_for("retries scheduled", || handle.stats().waiting == 4);
    assert_eq!(controller_counts(name), [3.0, 3.0, 1.0, 1.0, 3.0, 1.0, 1.0, 8.0, 0.0]);
    clock.advance(secs(10));
    assert!(handle.wait_idle(PATIENCE));
    // Second round: the four retried keys succeed.
    assert_eq!(controller_counts(name), [7.0, 3.0, 1.0, 1.0, 3.0, 1.0, 1.0, 12.0, 0.0]);
    assert_eq!(handle.stats().reconciles, 12);
    // The controller's queue is named after it: 8 enqueues + 4 retries
    // made ready; 4 retries scheduled (3 rate-limited, 1 requeue-after).
    assert_eq!(queue_counts(name), (12.0, 0.0, 4.0, 12.0, 12.0));
    assert_eq!(controller_value("controller_runtime_max_concurrent_reconciles", name), 2.0);
    assert!(handle2.stop_with_drain(PATIENCE));
}

#[test]
fn active_workers_and_unfinished_work_during_a_blocked_reconcile() {
    let name = "t_ctl_blocked";
    let gate = Gate::new();
    let block = gate.clone();
    let handle = Controller::new(name, move |key: &String, _ctx: &Context| -> Result<Action, ReconcileError> {
        if key == "block" {
            block.pass();
        }
        Ok(Action::Done)
    })
    .workers(3)
    .start();
    handle.enqueue("block".to_owned());
    gate.wait_arrivals(1);
    handle.enqueue("quick".to_owned());
    wait_for("the quick key", || handle.stats().reconciles == 1);
    assert_eq!(controller_value("controller_runtime_active_workers", name), 1.0);
    assert_eq!(controller_value("controller_runtime_max_concurrent_reconciles", name), 3.0);
    wait_for("unfinished work to grow", || {
        let (unfinished, longest) = processing_gauges(name);
        longest > 0.0 && unfinished == longest
    });
    gate.release();
    assert!(handle.wait_idle(PATIENCE));
    assert_eq!(controller_counts(name)[8], 0.0, "no active worker once idle");
    assert_eq!(processing_gauges(name), (0.0, 0.0));
    assert_eq!(controller_value("controller_runtime_reconcile_time_seconds_count", name), 2.0);
    assert!(handle.stop_with_drain(PATIENCE));
}

#[test]
fn held_keys_and_superseded_reconciles_per_controller() {
    let name = "metrics_dependencies";
    let labels = [("controller", name)];
    let (h, gate) = parent_held_by_cancelled_child(name);
    let s = scrape();
    assert_eq!(get(&s, "reconq_held_keys", &labels), 1.0, "the parent waits for the child");
    assert_eq!(get(&s, "reconq_superseded_reconciles_total", &labels), 0.0);
    for _ in 0..3 {
        gate.release();
    }
    assert!(h.wait_idle(PATIENCE));
    let s = scrape();
    assert_eq!(get(&s, "reconq_held_keys", &labels), 0.0);
    assert_eq!(get(&s, "reconq_superseded_reconciles_total", &labels), 1.0, "the child's first run");
    let success = [("controller", name), ("result", "success")];
    assert_eq!(get(&s, "controller_runtime_reconcile_total", &success), 2.0, "superseded runs are not results");
}

#[test]
fn same_named_controllers_are_summed_into_one_series() {
    let name = "t_ctl_twins";
    let a = Controller::new(name, scripted(CallCounts::default())).workers(1).start();
    let b = Controller::new(name, scripted(CallCounts::default())).workers(2).start();
    for key in ["s1", "s2", "e1"] {
        a.enqueue(key.to_owned());
    }
    for key in ["s1", "p1"] {
        b.enqueue(key.to_owned());
    }
    assert!(a.wait_idle(PATIENCE) && b.wait_idle(PATIENCE), "e1 retries after 5 ms");
    // `parse` fails on any duplicate series.
    let s = scrape();
    let c = [("controller", name)];
    assert_eq!(get(&s, "controller_runtime_max_concurrent_reconciles", &c), 3.0);
    assert_eq!(get(&s, "controller_runtime_reconcile_total", &[("controller", name), ("result", "success")]), 4.0);
    assert_eq!(get(&s, "controller_runtime_reconcile_total", &[("controller", name), ("result", "error")]), 2.0);
    assert_eq!(get(&s, "controller_runtime_reconcile_time_seconds_count", &c), 6.0);
    assert_eq!(get(&s, "workqueue_adds_total", &queue(name)), 6.0);
    let text = reconq::metrics::render();
    let series = format!("controller_runtime_max_concurrent_reconciles{{controller=\"{name}\"}} ");
    assert_eq!(text.matches(&series).count(), 1);
    assert!(a.stop_with_drain(PATIENCE) && b.stop_with_drain(PATIENCE));
}

#[test]
fn publish_mirrors_values_into_the_metrics_facade() {
    use metrics_util::MetricKind;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let name = "t_publish";
    let q = WorkQueue::<u32>::builder().name(name).build();
    for key in 0..3 {
        q.add(key);
    }
    for _ in 0..3 {
        let key = q.get().unwrap();
        if key != 2 {
            q.done(&key);
        }
    }
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let read = || {
        let mut found: HashMap<(MetricKind, String), DebugValue> = HashMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            if key.labels().any(|l| l.key() == "name" && l.value() == name) {
                found.insert((kind, key.name().to_owned()), value);
            }
        }
        found
    };
    metrics::with_local_recorder(&recorder, reconq::metrics::publish);
    let found = read();
    assert_eq!(found[&(MetricKind::Counter, "workqueue_adds_total".into())], DebugValue::Counter(3));
    assert_eq!(found[&(MetricKind::Counter, "workqueue_retries_total".into())], DebugValue::Counter(0));
    assert_eq!(found[&(MetricKind::Gauge, "workqueue_depth".into())], DebugValue::Gauge(0.0.into()));
    let histogram = |found: &HashMap<(MetricKind, String), DebugValue>, metric: &str| match &found
        [&(MetricKind::Histogram, metric.to_owned())]
    {
        DebugValue::Histogram(values) => values.iter().map(|v| v.into_inner()).collect::<Vec<f64>>(),
        other => panic!("{metric} is {other:?}"),
    };
    let bounds = [1e-8, 1e-7, 1e-6, 9.999999999999999e-6, 9.999999999999999e-5, 0.001, 0.01, 0.1, 1.0, 10.0];
    let queued = histogram(&found, "workqueue_queue_duration_seconds");
    assert_eq!(queued.len(), 3);
    assert!(queued.iter().all(|v| bounds.contains(v)), "recorded at bucket bounds: {queued:?}");
    assert_eq!(histogram(&found, "workqueue_work_duration_seconds").len(), 2);

    // A second publish records only what was observed since.
    q.done(&2);
    q.add(3);
    metrics::with_local_recorder(&recorder, reconq::metrics::publish);
    let found = read();
    assert_eq!(found[&(MetricKind::Counter, "workqueue_adds_total".into())], DebugValue::Counter(4));
    assert_eq!(found[&(MetricKind::Gauge, "workqueue_depth".into())], DebugValue::Gauge(1.0.into()));
    assert_eq!(histogram(&found, "workqueue_queue_duration_seconds").len(), 0);
    assert_eq!(histogram(&found, "workqueue_work_duration_seconds").len(), 1);
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_answers_get_metrics_and_404s_the_rest() {
    let name = "t_http";
    let q = WorkQueue::<u32>::builder().name(name).build();
    q.add(1);
    let mut server = reconq::metrics::serve("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    assert_ne!(server.port(), 0);

    let response = http_get(addr, "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"), "{head}");
    let length: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).unwrap().parse().unwrap();
    assert_eq!(length, body.len());
    assert_eq!(get(&parse(body), "workqueue_depth", &depth_at(name, "0")), 1.0);

    let response = http_get(addr, "/metrics?x=1");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"));
    for path in ["/", "/metricsx", "/favicon.ico"] {
        let response = http_get(addr, path);
        assert!(response.starts_with("HTTP/1.1 404 Not Found\r\n"), "{path}: {response}");
    }
    // A client that connects and sends nothing does not stop the server
    // for longer than its timeout; one that sends garbage gets a 404.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(b"\x00\x01garbage\r\n\r\n").unwrap();
    let mut answer = String::new();
    garbage.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"));

    server.close();
    assert!(TcpStream::connect(addr).is_err(), "closed server still accepts");
    server.close(); // twice is fine

    // Dropping stops it too.
    let server = reconq::metrics::serve("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    drop(server);
    assert!(TcpStream::connect(addr).is_err(), "dropped server still accepts");
}
