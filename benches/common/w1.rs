//! W1 drivers shared by the benches (guarantees §6, W1): one producer adds
//! keys `0..n`, `workers` threads take each key, do nothing with it, and
//! mark it done; each driver returns the time from the first add until the
//! last key is done. The same workload runs through a bare crossbeam channel
//! (the physical limit: no deduplication, no per-key state), the bare
//! `WorkQueue` and the full `Controller`, so their rates can be compared as
//! ratios measured side by side.

#![allow(dead_code)] // each bench uses the drivers it needs

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use reconq::{Action, Context, Controller, ReconcileError, WorkQueue};

/// How a W1 worker drives the bare queue.
#[derive(Clone, Copy, Debug)]
pub enum WorkerLoop {
    /// `get` then `done`: two lock round trips per key (client-go's loop,
    /// W1 as the guarantees define it).
    GetDone,
    /// `done_and_get`: one lock round trip per key (the controller's loop).
    DoneAndGet,
}

/// Takes keys from `q` until it is shut down and empty, calling `on_key`
/// on each before marking it done.
pub fn drain_with(q: &WorkQueue<u64>, style: WorkerLoop, mut on_key: impl FnMut(u64)) {
    match style {
        WorkerLoop::GetDone => {
            while let Some(key) = q.get() {
                on_key(key);
                q.done(&key);
            }
        }
        WorkerLoop::DoneAndGet => {
            let mut next = q.get();
            while let Some(key) = next {
                on_key(key);
                next = q.done_and_get(&key);
            }
        }
    }
}

/// Runs `workers` threads draining `q` with `on_key` (see [`drain_with`])
/// while `produce` runs on this thread; returns once every worker has seen
/// the queue shut down and empty (`produce` or `on_key` shuts it down).
pub fn with_workers(
    q: &WorkQueue<u64>,
    workers: usize,
    style: WorkerLoop,
    on_key: impl Fn(u64) + Sync,
    produce: impl FnOnce(),
) {
    thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| drain_with(q, style, &on_key));
        }
        produce();
    });
}

/// W1 through `q` (which the caller built: named or not).
pub fn queue_on(q: WorkQueue<u64>, n: u64, workers: usize, style: WorkerLoop) -> Duration {
    let mut started = Instant::now();
    with_workers(
        &q,
        workers,
        style,
        |key| {
            black_box(key);
        },
        || {
            started = Instant::now();
            for key in 0..n {
                q.add(key);
            }
            // Workers finish the ready keys, then see the shutdown.
            q.shut_down();
        },
    );
    started.elapsed()
}

/// W1 through a fresh unnamed queue.
pub fn queue(n: u64, workers: usize, style: WorkerLoop) -> Duration {
    queue_on(WorkQueue::new(), n, workers, style)
}

/// W1 through a bare unbounded crossbeam channel.
pub fn channel(n: u64, workers: usize) -> Duration {
    let (tx, rx) = crossbeam_channel::unbounded::<u64>();
    let mut started = Instant::now();
    thread::scope(|s| {
        for _ in 0..workers {
            let rx = rx.clone();
            s.spawn(move || {
                for key in rx {
                    black_box(key);
                }
            });
        }
        started = Instant::now();
        for key in 0..n {
            tx.send(key).unwrap();
        }
        drop(tx);
    });
    started.elapsed()
}

/// W1 through the floor of a one-lock queue: a `VecDeque` behind a
/// parking_lot mutex, one lock acquisition per add and per take, with no
/// deduplication and no per-key state; a worker that finds it empty spins
/// (with the lock released) until the producer has finished. What every
/// design with one lock around the queue's state pays per key, whatever it
/// does inside.
pub fn mutex_fifo(n: u64, workers: usize) -> Duration {
    use std::sync::atomic::{AtomicBool, Ordering};
    let fifo = parking_lot::Mutex::new(std::collections::VecDeque::new());
    let finished = AtomicBool::new(false);
    let mut started = Instant::now();
    thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let backoff = crossbeam_utils::Backoff::new();
                loop {
                    let key = fifo.lock().pop_front();
                    match key {
                        Some(key) => {
                            black_box(key);
                            backoff.reset();
                        }
                        None if finished.load(Ordering::Acquire) && fifo.lock().is_empty() => return,
                        None => backoff.snooze(),
                    }
                }
            });
        }
        started = Instant::now();
        for key in 0..n {
            fifo.lock().push_back(key);
        }
        finished.store(true, Ordering::Release);
    });
    started.elapsed()
}

/// W1 through a `Controller` with a no-op reconcile and none of its options
/// (its queue is named, so queue metrics are on, as for every controller).
/// `scheduled` turns priorities (four levels, `k % 4`) and groups (sixteen,
/// `k % 16`) on.
pub fn controller(n: u64, workers: usize, scheduled: bool) -> Duration {
    let reconcile = |_k: &u64, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) };
    let controller = Controller::new("w1", reconcile).workers(workers);
    let h = if scheduled { controller.group(|k: &u64| k % 16) } else { controller }.start();
    let started = Instant::now();
    if scheduled {
        for k in 0..n {
            h.enqueue_with_priority(k, (k % 4) as i32);
        }
    } else {
        for k in 0..n {
            h.enqueue(k);
        }
    }
    assert!(h.wait_idle(Duration::from_secs(600)));
    let took = started.elapsed();
    assert_eq!(h.stats().reconciles, n);
    h.stop();
    h.join_timeout(Duration::from_secs(60));
    took
}

/// A one-worker `Controller` (no-op reconcile) draining `n` keys enqueued
/// before it started: the time from start until idle, with no producer
/// running meanwhile (start queues the keys before the worker runs).
pub fn controller_drain(n: u64) -> Duration {
    let reconcile = |_k: &u64, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) };
    let controller = Controller::new("w1_drain", reconcile).workers(1);
    let handle = controller.handle();
    for k in 0..n {
        handle.enqueue(k);
    }
    let h = controller.start();
    let started = Instant::now();
    assert!(h.wait_idle(Duration::from_secs(600)));
    let took = started.elapsed();
    h.stop();
    h.join_timeout(Duration::from_secs(60));
    took
}

/// The median of `v` (not empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
