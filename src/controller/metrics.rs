//! A controller's metrics, with controller-runtime's names and semantics:
//! results counted by label (`success`, `error` — errors and panics —,
//! `requeue`, `requeue_after`), errors, terminal (permanent) errors,
//! panics, reconcile time, active workers and the configured worker count;
//! and reconq's own held keys and superseded reconciles (dependencies).
//!
//! The samples are collected in `status` (with the status row).
//!
//! Each worker records into its own cache-padded [`WorkerMetrics`] (one
//! writer per slot, so plain loads and stores, no contention between
//! workers); a scrape sums the slots. Reconcile time is measured on the
//! tick clock (real time even when the controller runs on a `FakeClock`),
//! from the hand-out of the key to having scheduled its retry (as
//! controller-runtime times its whole `reconcileHandler`), not counting
//! `done`. The worker reads the clock once per key: that reading ends one
//! reconcile's time, stamps `done` and the next hand-out in the queue, and
//! starts the next reconcile's time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::outcome::{Outcome, RetryPolicy};
use crate::observe::metrics::histogram::{RECONCILE_BUCKETS, RECONCILE_N, WorkerHistogram};
use crate::observe::metrics::ticks;

/// controller-runtime's `result` label values, in `WorkerMetrics::results`
/// order.
pub(super) const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];
const SUCCESS: usize = 0;
const ERROR: usize = 1;
const REQUEUE: usize = 2;
const REQUEUE_AFTER: usize = 3;

/// Whether a result counts as a success for the stats and the status:
/// `success`, and `requeue_after` (the reconcile did its work and asked for
/// a resync).
fn is_success(result: usize) -> bool {
    result == SUCCESS || result == REQUEUE_AFTER
}

/// How one reconcile is counted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counted {
    /// Index into [`RESULTS`].
    result: usize,
    /// A permanent error (controller-runtime's terminal error).
    terminal: bool,
}

impl Counted {
    pub(crate) fn of(outcome: &Outcome) -> Self {
        let (result, terminal) = match outcome {
            Outcome::Success => (SUCCESS, false),
            Outcome::Failure { retry, .. } => (ERROR, *retry == RetryPolicy::Never),
            Outcome::Requeue => (REQUEUE, false),
            Outcome::RequeueAfter(_) => (REQUEUE_AFTER, false),
        };
        Self { result, terminal }
    }
}

/// A controller's reconciles by result, summed over its workers' slots.
#[derive(Default)]
pub(crate) struct ResultTotals(pub(super) [u64; 4]);

impl ResultTotals {
    pub(crate) fn sum<'a>(workers: impl IntoIterator<Item = &'a WorkerMetrics>) -> Self {
        let mut totals = [0u64; 4];
        for worker in workers {
            for (total, count) in totals.iter_mut().zip(&worker.results) {
                *total += count.load(Relaxed);
            }
        }
        Self(totals)
    }

    pub(crate) fn reconciles(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(crate) fn successes(&self) -> u64 {
        (0..RESULTS.len()).filter(|&r| is_success(r)).map(|r| self.0[r]).sum()
    }

    pub(crate) fn failures(&self) -> u64 {
        self.0[ERROR]
    }

    pub(crate) fn requeues(&self) -> u64 {
        self.0[REQUEUE]
    }
}

/// The tick stamp of the latest success of any worker, if one succeeded.
pub(crate) fn last_success_tick<'a>(workers: impl IntoIterator<Item = &'a WorkerMetrics>) -> Option<u64> {
    workers.into_iter().map(|worker| worker.last_success.load(Relaxed)).filter(|&t| t != NO_SUCCESS).max()
}

/// `WorkerMetrics::last_success` before the worker's first success.
const NO_SUCCESS: u64 = u64::MAX;

/// One worker's counts; only that worker writes them. The controller's
/// stats and status read them too (summed over the workers), so a reconcile
/// costs no write to a cache line another worker writes.
pub(crate) struct WorkerMetrics {
    pub(super) reconcile_time: WorkerHistogram<RECONCILE_N>,
    results: [AtomicU64; 4],
    pub(super) terminal: AtomicU64,
    /// The tick stamp of this worker's latest success ([`NO_SUCCESS`]:
    /// none yet); the status turns it into a wall-clock time when read.
    last_success: AtomicU64,
}

impl WorkerMetrics {
    pub(crate) fn new() -> Self {
        Self {
            reconcile_time: WorkerHistogram::new(&RECONCILE_BUCKETS),
            results: [const { AtomicU64::new(0) }; 4],
            terminal: AtomicU64::new(0),
            last_success: AtomicU64::new(NO_SUCCESS),
        }
    }

    /// Records a reconcile that ran from tick `started` to tick `finished`.
    /// Called only by the slot's own worker.
    pub(crate) fn record(&self, started: u64, finished: u64, counted: Counted) {
        self.reconcile_time.observe_single_writer(ticks::since(started, finished));
        bump(&self.results[counted.result]);
        if counted.terminal {
            bump(&self.terminal);
        }
        if is_success(counted.result) {
            self.last_success.store(finished, Relaxed);
        }
    }
}

/// `+1` by the only writer: a load and a store, no read-modify-write.
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Relaxed) + 1, Relaxed);
}
