//! Controller benchmarks (guarantees §6): W1 through the full `Controller`
//! and through the bare `WorkQueue` side by side (the controller's overhead
//! is the ratio), W1 with priorities and groups on (`scheduled`: the cost of
//! the fair ready set against `controller`), W5 retries, and the W9
//! fairness report (printed after the criterion groups).
//!
//! `cargo bench --bench controller -- --quick` (`-- W9` for the report only)

#[path = "common/groups.rs"]
mod groups;
#[path = "common/w1.rs"]
mod w1;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use reconq::{Action, Context, Controller, ExponentialBackoff, ReconcileError};

type Res = Result<Action, ReconcileError>;

/// W1 keys (the spec's N is 1,000,000; smaller keeps the run short).
const N: u64 = 200_000;

fn w1(c: &mut Criterion) {
    let mut group = c.benchmark_group("W1");
    group.throughput(Throughput::Elements(N));
    group.sample_size(10);
    for workers in [1, 2, 4, 8] {
        group.bench_with_input(BenchmarkId::new("controller", workers), &workers, |b, &w| {
            b.iter_custom(|iters| (0..iters).map(|_| w1::controller(N, w, false)).sum())
        });
        group.bench_with_input(BenchmarkId::new("scheduled", workers), &workers, |b, &w| {
            b.iter_custom(|iters| (0..iters).map(|_| w1::controller(N, w, true)).sum())
        });
        group.bench_with_input(BenchmarkId::new("queue", workers), &workers, |b, &w| {
            b.iter_custom(|iters| (0..iters).map(|_| w1::queue(N, w, w1::WorkerLoop::DoneAndGet)).sum())
        });
    }
    group.finish();
}

/// W5: 10,000 keys, each fails 3 times then succeeds,
/// ExponentialBackoff(1 ms, 100 ms), 4 workers; 40,000 calls.
fn w5_once() -> Duration {
    const KEYS: usize = 10_000;
    let failures: Arc<Vec<AtomicU8>> = Arc::new((0..KEYS).map(|_| AtomicU8::new(0)).collect());
    let calls = Arc::new(AtomicU64::new(0));
    let (f, c) = (Arc::clone(&failures), Arc::clone(&calls));
    let h = Controller::new("w5", move |k: &usize, _: &Context| -> Res {
        c.fetch_add(1, Ordering::Relaxed);
        if f[*k].fetch_add(1, Ordering::Relaxed) < 3 {
            return Err(ReconcileError::new("not yet"));
        }
        Ok(Action::Done)
    })
    .workers(4)
    .rate_limiter(ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(100)))
    .start();
    let start = Instant::now();
    for k in 0..KEYS {
        h.enqueue(k);
    }
    assert!(h.wait_idle(Duration::from_secs(600)));
    let took = start.elapsed();
    assert_eq!(calls.load(Ordering::Relaxed), 40_000);
    h.stop();
    took
}

fn w5(c: &mut Criterion) {
    let mut group = c.benchmark_group("W5");
    group.throughput(Throughput::Elements(40_000));
    group.sample_size(10);
    group.bench_function("retries", |b| b.iter_custom(|iters| (0..iters).map(|_| w5_once()).sum()));
    group.finish();
}

/// Spins for `d`: W9's "100 µs of work" keeps a worker busy, as real work
/// would (a sleep would hand the core to the others).
fn spin_for(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// W9 (guarantees, "Benchmarks of scheduling"): 100,000 ready keys of
/// group A, then 100 of group B; 4 workers, reconcile = 100 µs of work.
/// Returns the time from the first B enqueue until every B key is done,
/// with or without `group`.
fn w9_once(grouped: bool, a_keys: u32) -> Duration {
    const B_KEYS: u32 = 100;
    let b_left = Arc::new(AtomicU64::new(u64::from(B_KEYS)));
    let b_done_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let (left, done_at) = (Arc::clone(&b_left), Arc::clone(&b_done_at));
    let controller = Controller::new("w9", move |k: &(u8, u32), _: &Context| -> Res {
        spin_for(Duration::from_micros(100));
        if k.0 == b'B' && left.fetch_sub(1, Ordering::AcqRel) == 1 {
            *done_at.lock().unwrap() = Some(Instant::now());
        }
        Ok(Action::Done)
    })
    .workers(4);
    let controller = if grouped { controller.group(|k: &(u8, u32)| k.0) } else { controller };
    // Enqueued before start, so all of A is ready when the workers begin.
    let h = controller.handle();
    for i in 0..a_keys {
        h.enqueue((b'A', i));
    }
    let h = controller.start();
    let start = Instant::now();
    for i in 0..B_KEYS {
        h.enqueue((b'B', i));
    }
    while b_left.load(Ordering::Acquire) > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = b_done_at.lock().unwrap().expect("every B key done").duration_since(start);
    h.stop();
    h.join_timeout(Duration::from_secs(60));
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn w9_report(quick: bool) {
    let (rounds, a_keys) = if quick { (3, 20_000) } else { (5, 100_000) };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        with.push(w9_once(true, a_keys));
        without.push(w9_once(false, a_keys));
    }
    let (with, without) = (median(with), median(without));
    println!(
        "W9 fairness: {a_keys} A keys then 100 B keys, 4 workers, 100 us each; every B key done after \
         {with:.1?} with group, {without:.1?} without (medians of {rounds}; {:.0}x)",
        without.as_secs_f64() / with.as_secs_f64()
    );
}

fn main() {
    groups::run(&[("W1", w1), ("W5", w5)], &[("W9", || w9_report(groups::quick()))]);
}
