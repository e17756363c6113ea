//! The hot path (W1, guarantees §6): the bare crossbeam channel, a
//! one-lock FIFO, the bare `WorkQueue` and the full `Controller` side by
//! side, N = 1,000,000.
//!
//! * `W1_table` is a criterion group with each of them at 1, 2, 4 and 8
//!   workers (rates with criterion's statistics).
//! * `W1_ratios` (a report printed after it) runs them in rounds, rotating
//!   their order within each round, and prints the medians of the per-round
//!   ratios: queue / channel, queue / the one-lock floor (`mutex_fifo`: a
//!   `VecDeque` behind a mutex, what any queue with one lock pays per key)
//!   and controller / queue. Ratios from one round
//!   share the machine's load of that moment, so they are the figures to
//!   read on a shared VM. `RECONQ_W1_ROUNDS` sets the rounds (default 5).
//!
//! * `W1_alone` (a report) times one thread adding N keys and then draining
//!   them: the data structure's cost per key on a deep backlog, without the
//!   lock hand-offs between threads that W1 adds.
//!
//! `cargo bench --bench hot_path` runs all three; `-- W1_ratios` (or
//! `-- W1_alone`) only that report.

#[path = "common/groups.rs"]
mod groups;
#[path = "common/w1.rs"]
mod w1;

use criterion::{BenchmarkId, Criterion, Throughput};
use std::time::Duration;
use w1::WorkerLoop;

/// W1's N; `RECONQ_W1_KEYS` overrides it (a backlog that fits in cache
/// shows how much of the cost is cache misses).
fn keys() -> u64 {
    std::env::var("RECONQ_W1_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}
const WORKERS: [usize; 4] = [1, 2, 4, 8];

/// The contenders, in the report's column order.
const CONTENDERS: [&str; 5] = ["channel", "mutex_fifo", "queue", "queue_done_and_get", "controller"];

fn run(contender: &str, workers: usize) -> Duration {
    let n = keys();
    match contender {
        "channel" => w1::channel(n, workers),
        "mutex_fifo" => w1::mutex_fifo(n, workers),
        "queue" => w1::queue(n, workers, WorkerLoop::GetDone),
        "queue_done_and_get" => w1::queue(n, workers, WorkerLoop::DoneAndGet),
        "controller" => w1::controller(n, workers, false),
        _ => unreachable!("unknown contender {contender}"),
    }
}

fn w1_table(c: &mut Criterion) {
    let mut group = c.benchmark_group("W1_table");
    group.throughput(Throughput::Elements(keys())).sample_size(10);
    for workers in WORKERS {
        for contender in CONTENDERS {
            group.bench_with_input(BenchmarkId::new(contender, workers), &workers, |b, &w| {
                b.iter_custom(|iters| (0..iters).map(|_| run(contender, w)).sum())
            });
        }
    }
    group.finish();
}

fn w1_ratios() {
    let rounds: usize = std::env::var("RECONQ_W1_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    println!(
        "W1_ratios: N = {}, {rounds} rounds; rates in M keys/s (medians), ratios medians of per-round ratios",
        keys()
    );
    println!(
        "| workers | channel | one-lock floor | queue (get+done) | queue (done_and_get) | Controller \
         | queue / channel | queue / floor | Controller / queue |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for workers in WORKERS {
        let mut rates: Vec<[f64; 5]> = Vec::new();
        for round in 0..rounds {
            let mut rate = [0.0; 5];
            for i in 0..CONTENDERS.len() {
                let which = (i + round) % CONTENDERS.len();
                rate[which] = keys() as f64 / run(CONTENDERS[which], workers).as_secs_f64();
            }
            rates.push(rate);
        }
        let col = |i: usize| w1::median(rates.iter().map(|r| r[i] / 1e6).collect());
        let ratio = |f: &dyn Fn(&[f64; 5]) -> f64| w1::median(rates.iter().map(f).collect());
        // The queue's best loop against the channel and the one-lock floor;
        // the controller against the queue's best loop (it could use either).
        let queue_best = |r: &[f64; 5]| r[2].max(r[3]);
        println!(
            "| {workers} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} |",
            col(0),
            col(1),
            col(2),
            col(3),
            col(4),
            ratio(&|r| queue_best(r) / r[0]),
            ratio(&|r| queue_best(r) / r[1]),
            ratio(&|r| r[4] / queue_best(r)),
        );
    }
}

/// The per-key cost with no second thread: one thread adds N keys, then
/// drains them with `done_and_get` (a backlog of N, as W1 builds when the
/// producer runs ahead, but no lock hand-offs); and a one-worker
/// `Controller` draining N keys enqueued before it started (its worker
/// alone). Separates what the data structure and the reconcile loop cost
/// from what contention adds in W1.
fn w1_alone() {
    let rounds: usize = std::env::var("RECONQ_W1_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let n = keys();
    let (mut adds, mut drains, mut controller) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        controller.push(n as f64 / w1::controller_drain(n).as_secs_f64() / 1e6);
        let q = reconq::WorkQueue::new();
        let started = std::time::Instant::now();
        for key in 0..n {
            q.add(key);
        }
        adds.push(n as f64 / started.elapsed().as_secs_f64() / 1e6);
        let started = std::time::Instant::now();
        let mut next = q.get();
        while let Some(key) = next {
            std::hint::black_box(key);
            next = if q.is_empty() { None } else { q.done_and_get(&key) };
        }
        drains.push(n as f64 / started.elapsed().as_secs_f64() / 1e6);
    }
    println!(
        "W1_alone: one thread, N = {n}: add {:.2} M keys/s, then get/done (done_and_get) {:.2} M keys/s; \
         a one-worker Controller draining N keys enqueued before start {:.2} M keys/s (medians of {rounds})",
        w1::median(adds),
        w1::median(drains),
        w1::median(controller)
    );
}

fn main() {
    groups::run(&[("W1_table", w1_table)], &[("W1_ratios", w1_ratios), ("W1_alone", w1_alone)]);
}
