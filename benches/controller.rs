//! Controller benchmarks (spec §6): W1 through the full `Controller` and
//! through the bare `WorkQueue` side by side (the controller's overhead is
//! the ratio), and W5 retries.
//!
//! `cargo bench --bench controller -- --quick`

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use reconq::{Action, Context, Controller, ExponentialBackoff, ReconcileError, WorkQueue};

type Res = Result<Action, ReconcileError>;

/// W1 keys (the spec's N is 1,000,000; smaller keeps the run short).
const N: u64 = 200_000;

/// W1 through the controller: one producer enqueues 0..N, W workers run a
/// no-op reconcile; time until all N are reconciled.
fn w1_controller(workers: usize) -> Duration {
    let h = Controller::new("w1", |_k: &u64, _: &Context| -> Res { Ok(Action::Done) }).workers(workers).start();
    let start = Instant::now();
    for k in 0..N {
        h.enqueue(k);
    }
    assert!(h.wait_idle(Duration::from_secs(600)));
    let took = start.elapsed();
    assert_eq!(h.stats().reconciles, N);
    h.stop();
    h.join_timeout(Duration::from_secs(60));
    took
}

/// W1 through the bare queue: workers loop `done_and_get`.
fn w1_queue(workers: usize) -> Duration {
    let q: WorkQueue<u64> = WorkQueue::new();
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (q, done) = (q.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut next = q.get();
                while let Some(k) = next {
                    done.fetch_add(1, Ordering::Relaxed);
                    next = q.done_and_get(&k);
                }
            })
        })
        .collect();
    let start = Instant::now();
    for k in 0..N {
        q.add(k);
    }
    assert!(q.wait_idle(Duration::from_secs(600)));
    let took = start.elapsed();
    assert_eq!(done.load(Ordering::Relaxed), N);
    q.shut_down();
    for t in threads {
        t.join().unwrap();
    }
    took
}

fn w1(c: &mut Criterion) {
    let mut group = c.benchmark_group("W1");
    group.throughput(Throughput::Elements(N));
    group.sample_size(10);
    for workers in [1, 2, 4, 8] {
        group.bench_with_input(BenchmarkId::new("controller", workers), &workers, |b, &w| {
            b.iter_custom(|iters| (0..iters).map(|_| w1_controller(w)).sum())
        });
        group.bench_with_input(BenchmarkId::new("queue", workers), &workers, |b, &w| {
            b.iter_custom(|iters| (0..iters).map(|_| w1_queue(w)).sum())
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

criterion_group!(benches, w1, w5);
criterion_main!(benches);
