//! Model checking with shuttle: random schedules of the real queue code (its
//! mutex and condvars are shuttle's under the `shuttle` feature). Only
//! untimed operations: shuttle's condvar waits never time out.
//!
//! Run with `cargo test --features shuttle --test shuttle`.
#![cfg(feature = "shuttle")]

use std::sync::Arc;

use reconq::{QueueCounts, WorkQueue};
use shuttle::sync::Mutex;
use shuttle::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use shuttle::thread;

const ITERATIONS: usize = 3000;

/// Who holds the key and what happened, shared by the model's threads.
#[derive(Default)]
struct Log {
    busy: AtomicBool,
    handouts: AtomicUsize,
    /// Hand-outs that started after the last add (reset by every add).
    handouts_since_add: Mutex<usize>,
    /// Set just before the main thread starts a drain.
    draining: AtomicBool,
    /// Hand-outs that began before `draining` was set and are not yet done.
    early_in_flight: AtomicUsize,
}

impl Log {
    fn add(&self, q: &WorkQueue<u8>) {
        // Under the log lock, so "after the add" is well defined.
        let mut since = self.handouts_since_add.lock().unwrap();
        q.add(0);
        *since = 0;
    }

    /// A worker loop: get / check exclusivity / done, until shut down.
    fn work(&self, q: &WorkQueue<u8>) {
        while let Some(k) = q.get() {
            let early = !self.draining.load(SeqCst);
            if early {
                self.early_in_flight.fetch_add(1, SeqCst);
            }
            *self.handouts_since_add.lock().unwrap() += 1;
            assert!(!self.busy.swap(true, SeqCst), "G2: two workers hold the key");
            self.handouts.fetch_add(1, SeqCst);
            thread::yield_now();
            self.busy.store(false, SeqCst);
            if early {
                self.early_in_flight.fetch_sub(1, SeqCst);
            }
            q.done(&k);
        }
    }
}

/// Two workers and a producer on one key; the main thread drains. When the
/// drain returns, every hand-out that began before it is done. (A key still
/// *ready* when the drain starts is not waited for, as in client-go, so a
/// worker may take it after the drain returned: no stronger check here.)
/// After the workers exit, the last add was followed by a hand-out (G3).
#[test]
fn workers_and_producer_then_drain() {
    shuttle::check_random(workers_and_producer_then_drain_model, ITERATIONS);
}

fn workers_and_producer_then_drain_model() {
    let q = WorkQueue::<u8>::new();
    let log = Arc::new(Log::default());
    log.add(&q);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (q, log) = (q.clone(), Arc::clone(&log));
            thread::spawn(move || log.work(&q))
        })
        .collect();
    let producer = {
        let (q, log) = (q.clone(), Arc::clone(&log));
        thread::spawn(move || {
            log.add(&q);
            log.add(&q);
        })
    };
    producer.join().unwrap();
    log.draining.store(true, SeqCst);
    q.shut_down_with_drain();
    assert_eq!(log.early_in_flight.load(SeqCst), 0, "drain returned with a key in flight");
    for w in workers {
        w.join().unwrap();
    }
    assert!(*log.handouts_since_add.lock().unwrap() > 0, "G3: the last add was lost");
    assert_eq!(q.counts(), QueueCounts::default());
}

/// A key made dirty while processing, then a drain starts: the dirty key is
/// handed out again (to whichever worker), and the drain returns only after
/// that second hand-out is done. Nothing else can be handed out after the
/// drain returns, so the checks there are exact.
#[test]
fn drain_with_a_dirty_key_hands_it_out_again() {
    shuttle::check_random(
        || {
            let q = WorkQueue::<u8>::new();
            let log = Arc::new(Log::default());
            log.add(&q);
            let first = q.get().unwrap();
            log.busy.store(true, SeqCst);
            log.handouts.fetch_add(1, SeqCst);
            log.add(&q); // dirty
            let drain = {
                let (q, log) = (q.clone(), Arc::clone(&log));
                thread::spawn(move || {
                    q.shut_down_with_drain();
                    assert_eq!(q.counts().processing, 0, "drain returned with a key in flight");
                    assert!(!log.busy.load(SeqCst), "drain returned while a worker held the key");
                    assert_eq!(log.handouts.load(SeqCst), 2, "the dirty key was not handed out again");
                })
            };
            let worker = {
                let (q, log) = (q.clone(), Arc::clone(&log));
                thread::spawn(move || log.work(&q))
            };
            // Once the drain has begun, the main thread finishes its key, then
            // keeps working like any worker loop would.
            while !q.is_shutting_down() {
                thread::yield_now();
            }
            log.busy.store(false, SeqCst);
            q.done(&first);
            log.work(&q);
            drain.join().unwrap();
            worker.join().unwrap();
            assert_eq!(log.handouts.load(SeqCst), 2);
        },
        ITERATIONS,
    );
}

/// shut_down while getters are parked releases them all, and shut_down
/// during a pending drain ends the drain.
#[test]
fn shut_down_releases_getters_and_a_pending_drain() {
    shuttle::check_random(
        || {
            let q = WorkQueue::<u8>::new();
            q.add(0);
            let held = q.get().unwrap();
            let getters: Vec<_> = (0..2)
                .map(|_| {
                    let q = q.clone();
                    thread::spawn(move || q.get())
                })
                .collect();
            let drain = {
                let q = q.clone();
                thread::spawn(move || q.shut_down_with_drain())
            };
            q.shut_down();
            drain.join().unwrap();
            for g in getters {
                assert_eq!(g.join().unwrap(), None);
            }
            q.done(&held);
            assert_eq!(q.counts(), QueueCounts::default());
        },
        ITERATIONS,
    );
}
