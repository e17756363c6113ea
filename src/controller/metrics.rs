//! A controller's metrics, with controller-runtime's names and semantics:
//! results counted by label (`success`, `error` — errors and panics —,
//! `requeue`, `requeue_after`), errors, terminal (permanent) errors,
//! panics, reconcile time, active workers and the configured worker count;
//! and reconq's own held keys and superseded reconciles (dependencies).
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
use super::worker::WorkerSlot;
use super::{ControllerKey, Core};
use crate::observe::metrics::MetricFamilies;
use crate::observe::metrics::histogram::{RECONCILE_BUCKETS, RECONCILE_N, WorkerHistogram};
use crate::observe::metrics::ticks;

/// controller-runtime's `result` label values, in `WorkerMetrics::results`
/// order.
const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];
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
pub(crate) struct ResultTotals([u64; 4]);

impl ResultTotals {
    pub(crate) fn sum<K>(slots: &[WorkerSlot<K>]) -> Self {
        let mut totals = [0u64; 4];
        for slot in slots {
            for (total, count) in totals.iter_mut().zip(&slot.metrics.results) {
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
pub(crate) fn last_success_tick<K>(slots: &[WorkerSlot<K>]) -> Option<u64> {
    slots.iter().map(|slot| slot.metrics.last_success.load(Relaxed)).filter(|&t| t != NO_SUCCESS).max()
}

/// `WorkerMetrics::last_success` before the worker's first success.
const NO_SUCCESS: u64 = u64::MAX;

/// One worker's counts; only that worker writes them. The controller's
/// stats and status read them too (summed over the workers), so a reconcile
/// costs no write to a cache line another worker writes.
pub(crate) struct WorkerMetrics {
    reconcile_time: WorkerHistogram<RECONCILE_N>,
    results: [AtomicU64; 4],
    terminal: AtomicU64,
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

/// Adds `core`'s samples, labelled `controller`.
pub(crate) fn collect<K: ControllerKey>(core: &Core<K>, out: &mut MetricFamilies) {
    let controller = core.name.as_str();
    let labels = [("controller", controller)];
    let mut results = ResultTotals::default();
    let mut terminal = 0;
    let mut active = 0;
    let mut held = 0;
    let mut reconcile_time = WorkerHistogram::<RECONCILE_N>::new(&RECONCILE_BUCKETS).snapshot();
    let workers = match core.rt.get() {
        Some(rt) => {
            results = ResultTotals::sum(&rt.slots);
            for slot in &rt.slots {
                terminal += slot.metrics.terminal.load(Relaxed);
                reconcile_time.merge(&slot.metrics.reconcile_time.snapshot());
                active += usize::from(slot.running.lock().is_some());
            }
            held = rt.queue.counts_and_held().1;
            rt.workers
        }
        None => core.configured_workers(),
    };
    for (result, count) in RESULTS.iter().zip(results.0) {
        out.counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            &[("controller", controller), ("result", result)],
            count as f64,
        );
    }
    out.counter(
        "controller_runtime_reconcile_errors_total",
        "Total number of reconciliation errors per controller",
        &labels,
        results.failures() as f64,
    );
    out.counter(
        "controller_runtime_terminal_reconcile_errors_total",
        "Total number of terminal reconciliation errors per controller",
        &labels,
        terminal as f64,
    );
    out.counter(
        "controller_runtime_reconcile_panics_total",
        "Total number of reconciliation panics per controller",
        &labels,
        core.counters.panics.load(Relaxed) as f64,
    );
    if core.rt.get().is_some_and(|rt| rt.timeout.is_some()) {
        out.counter(
            "controller_runtime_reconcile_timeouts_total",
            "Total number of reconciliations cancelled at their timeout per controller",
            &labels,
            core.counters.timeouts.load(Relaxed) as f64,
        );
    }
    // Dependencies (guarantees §14): reconq's own, always there, so a
    // dashboard or alert needs no `absent()`.
    out.gauge(
        "reconq_held_keys",
        "Ready keys held by a pending ancestor or waiting for cancelled descendants per controller",
        &labels,
        held as f64,
    );
    out.counter(
        "reconq_superseded_reconciles_total",
        "Total number of reconciles cancelled because an ancestor became pending per controller",
        &labels,
        core.counters.superseded.load(Relaxed) as f64,
    );
    out.histogram(
        "controller_runtime_reconcile_time_seconds",
        "Length of time per reconciliation per controller",
        &labels,
        reconcile_time,
    );
    out.gauge(
        "controller_runtime_active_workers",
        "Number of currently used workers per controller",
        &labels,
        active as f64,
    );
    out.gauge(
        "controller_runtime_max_concurrent_reconciles",
        "Maximum number of concurrent reconciles per controller",
        &labels,
        workers as f64,
    );
}
