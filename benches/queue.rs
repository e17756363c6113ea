//! Work-queue benchmarks: workloads W1–W5 of the spec (§6).
//!
//! W1, W2 and W5 are criterion groups (throughput / wall time). W1 moves the
//! same keys through a bare `crossbeam-channel` in the same group: the
//! physical baseline with no deduplication, so the queue's rate can be read
//! as a ratio on a noisy machine. W3 (lateness of delayed keys) and W4 (CPU
//! used while idle) are distributions and CPU counts rather than times; they
//! are printed as a report after the criterion groups.
//!
//! `W1_metrics` runs W1 on an unnamed queue (no metrics) and on a named one
//! (metrics recorded) in back-to-back pairs and prints the throughput ratio
//! per worker count (a report, like W3 and W4).
//!
//! `cargo bench --bench queue` runs everything; `-- W1` (any substring of a
//! group name) narrows it, and `--quick` shortens the criterion groups.

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/groups.rs"]
mod groups;
#[path = "common/w1.rs"]
mod w1;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use reconq::{ExponentialBackoff, WorkQueue};
use w1::{WorkerLoop, with_workers};

const W1_KEYS: u64 = 1_000_000;
const W1_WORKERS: [usize; 4] = [1, 2, 4, 8];
const W2_ADDS: u64 = 1_000_000;
const W2_HOT_KEYS: u64 = 1000;
const W3_KEYS: u64 = 100_000;
const W3_MAX_DELAY: Duration = Duration::from_millis(200);
const W4_IDLE: Duration = Duration::from_secs(5);
const W5_KEYS: u64 = 10_000;
const W5_FAILURES: u32 = 3;

fn w1_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("W1_throughput");
    group.throughput(Throughput::Elements(W1_KEYS)).sample_size(10);
    for workers in W1_WORKERS {
        let id = |name| BenchmarkId::new(name, workers);
        group.bench_function(id("crossbeam_channel"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| w1::channel(W1_KEYS, workers)).sum())
        });
        group.bench_function(id("reconq_get_done"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| w1::queue(W1_KEYS, workers, WorkerLoop::GetDone)).sum())
        });
        group.bench_function(id("reconq_done_and_get"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| w1::queue(W1_KEYS, workers, WorkerLoop::DoneAndGet)).sum())
        });
    }
    group.finish();
}

/// W1 on an unnamed queue (no metrics) and on a named one (metrics on),
/// side by side. The machine is shared and its load drifts, so runs are
/// made in rounds of three back to back (unnamed, named, and a second
/// unnamed as a control), rotating their order, and the report gives the
/// median of the per-round ratios: named / unnamed is the overhead, the
/// control unnamed / unnamed shows how far noise alone moves that median.
/// `RECONQ_W1_ROUNDS` sets the number of rounds (default 9, 3 with
/// `--quick`).
fn w1_metrics_report(quick: bool) {
    let rounds: usize =
        std::env::var("RECONQ_W1_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(if quick { 3 } else { 9 });
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "W1_metrics: unnamed vs named queue, N = {W1_KEYS}, {rounds} rounds; rates are medians (M keys/s), \
         ratios medians of per-round throughput ratios"
    );
    for (style_name, style) in [("done_and_get", WorkerLoop::DoneAndGet), ("get_done", WorkerLoop::GetDone)] {
        for workers in W1_WORKERS {
            // Per round: throughput of [unnamed, named, control].
            let mut rates: Vec<[f64; 3]> = Vec::new();
            for round in 0..rounds {
                let mut rate = [0.0; 3];
                for i in 0..3 {
                    let which = (i + round) % 3;
                    let q = if which == 1 {
                        WorkQueue::<u64>::builder().name("bench_w1").build()
                    } else {
                        WorkQueue::<u64>::new()
                    };
                    rate[which] = W1_KEYS as f64 / w1::queue_on(q, W1_KEYS, workers, style).as_secs_f64();
                }
                rates.push(rate);
            }
            let ratio = median(rates.iter().map(|r| r[1] / r[0]).collect());
            let control = median(rates.iter().map(|r| r[2] / r[0]).collect());
            println!(
                "  {style_name:<12} {workers} workers: unnamed {:>6.2}  named {:>6.2}  \
                 named/unnamed {ratio:.3} ({:+.1}%)  control {control:.3}",
                median(rates.iter().map(|r| r[0] / 1e6).collect()),
                median(rates.iter().map(|r| r[1] / 1e6).collect()),
                (ratio - 1.0) * 100.0,
            );
        }
    }
}

/// W2: a million adds over a thousand hot keys, four workers. Returns the
/// time until the producer finished and the queue drained, and how many
/// reconciles ran (dedup collapses most adds).
fn w2_hot_keys_once() -> (Duration, u64) {
    let q = WorkQueue::<u64>::new();
    let reconciles = AtomicU64::new(0);
    let started = Instant::now();
    let reconcile = |_| {
        reconciles.fetch_add(1, Ordering::Relaxed);
    };
    with_workers(&q, 4, WorkerLoop::DoneAndGet, reconcile, || {
        for i in 0..W2_ADDS {
            q.add(i % W2_HOT_KEYS);
        }
        q.shut_down();
    });
    (started.elapsed(), reconciles.into_inner())
}

fn w2_hot_keys(c: &mut Criterion) {
    let reconciles = bench_counting(c, "W2_hot_keys", Some(W2_ADDS), w2_hot_keys_once);
    println!("W2: {W2_ADDS} adds over {W2_HOT_KEYS} keys ran {reconciles} reconciles (last run)");
}

/// Benchmarks `run` (which returns its own measured time and a count) as
/// group `name`; returns the count of the last run.
fn bench_counting(c: &mut Criterion, name: &str, elements: Option<u64>, run: fn() -> (Duration, u64)) -> u64 {
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    if let Some(n) = elements {
        group.throughput(Throughput::Elements(n));
    }
    let mut last_count = 0;
    group.bench_function("reconq", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let (elapsed, count) = run();
                    last_count = count;
                    elapsed
                })
                .sum()
        })
    });
    group.finish();
    last_count
}

/// W5: every key fails three times (rate-limited retries with 1–100 ms
/// exponential backoff) and then succeeds. Returns wall time and calls.
fn w5_retries_once() -> (Duration, u64) {
    let q = WorkQueue::with_rate_limiter(ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(100)));
    let calls = AtomicU64::new(0);
    let succeeded = AtomicU64::new(0);
    let started = Instant::now();
    let reconcile = |key| {
        calls.fetch_add(1, Ordering::Relaxed);
        if q.num_requeues(&key) < W5_FAILURES {
            q.add_rate_limited(key);
        } else {
            q.forget(&key);
            if succeeded.fetch_add(1, Ordering::Relaxed) + 1 == W5_KEYS {
                q.shut_down();
            }
        }
    };
    with_workers(&q, 4, WorkerLoop::DoneAndGet, reconcile, || {
        for key in 0..W5_KEYS {
            q.add(key);
        }
    });
    (started.elapsed(), calls.into_inner())
}

fn w5_retries(c: &mut Criterion) {
    let calls = bench_counting(c, "W5_retries", None, w5_retries_once);
    println!("W5: {W5_KEYS} keys x {} tries made {calls} calls (last run)", W5_FAILURES + 1);
}

/// A small deterministic generator (splitmix64) for W3's delays.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// W3: 100,000 keys added with delays uniform in [0, 200 ms); two workers
/// record how late each key is handed out. Prints p50/p99/max lateness and
/// the CPU time the run used.
fn w3_delaying_report() {
    let q = WorkQueue::<u64>::new();
    let base = Instant::now();
    let due_nanos: Vec<AtomicU64> = (0..W3_KEYS).map(|_| AtomicU64::new(0)).collect();
    let lateness: Vec<AtomicU64> = (0..W3_KEYS).map(|_| AtomicU64::new(0)).collect();
    let handed_out = AtomicUsize::new(0);
    let cpu_before = cpu::process_cpu_time();
    let record_lateness = |key| {
        let now = base.elapsed().as_nanos() as u64;
        let late = now.saturating_sub(due_nanos[key as usize].load(Ordering::Acquire));
        lateness[key as usize].store(late, Ordering::Relaxed);
        if handed_out.fetch_add(1, Ordering::Relaxed) + 1 == W3_KEYS as usize {
            q.shut_down();
        }
    };
    with_workers(&q, 2, WorkerLoop::DoneAndGet, record_lateness, || {
        let mut seed = 0x5EED;
        for key in 0..W3_KEYS {
            let delay = Duration::from_nanos(splitmix64(&mut seed) % W3_MAX_DELAY.as_nanos() as u64);
            let due = base.elapsed() + delay;
            due_nanos[key as usize].store(due.as_nanos() as u64, Ordering::Release);
            q.add_after(key, delay);
        }
    });
    let cpu = cpu::process_cpu_time() - cpu_before;
    let mut late: Vec<u64> = lateness.into_iter().map(AtomicU64::into_inner).collect();
    late.sort_unstable();
    let pct = |p: f64| Duration::from_nanos(late[((late.len() - 1) as f64 * p) as usize]);
    println!(
        "W3 delaying: {W3_KEYS} keys, delays in [0, {W3_MAX_DELAY:?}), 2 workers: lateness p50 {:?} p99 {:?} max {:?}; CPU time {cpu:?}",
        pct(0.50),
        pct(0.99),
        pct(1.0),
    );
}

/// W4: four workers blocked on an empty queue (and on one key due in an
/// hour) for five seconds. Prints the CPU time used meanwhile.
fn w4_idle_report() {
    for delayed in [false, true] {
        let q = WorkQueue::<u64>::new();
        if delayed {
            q.add_after(0, Duration::from_secs(3600));
        }
        let cpu_before = cpu::process_cpu_time();
        with_workers(
            &q,
            4,
            WorkerLoop::GetDone,
            |_| {},
            || {
                thread::sleep(W4_IDLE);
                q.shut_down();
            },
        );
        let cpu = cpu::process_cpu_time() - cpu_before;
        let what = if delayed { "empty but for one key due in an hour" } else { "empty" };
        println!("W4 idle: 4 workers blocked on an {what} queue for {W4_IDLE:?}: CPU time {cpu:?} (incl. spawn/join)");
    }
}

fn main() {
    groups::run(
        &[("W1_throughput", w1_throughput), ("W2_hot_keys", w2_hot_keys), ("W5_retries", w5_retries)],
        &[
            ("W3_delaying", w3_delaying_report),
            ("W4_idle", w4_idle_report),
            ("W1_metrics", || w1_metrics_report(groups::quick())),
        ],
    );
}
