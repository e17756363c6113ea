//! A controller's row in the global status ([`crate::status`]) and its
//! metrics' samples: what the controller reports to `observe`.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::core::{ControllerKey, Core, Counters};
use super::gate::Gate;
use super::hangs::{log_hangs, scan};
use super::life::Phase;
use super::metrics::{RESULTS, ResultTotals, last_success_tick};
use crate::observe::fields::{Field, Health, Visit, walk_scale_out};
use crate::observe::metrics::histogram::{RECONCILE_BUCKETS, RECONCILE_N, WorkerHistogram};
use crate::observe::metrics::{MetricFamilies, ticks};
use crate::observe::status::{ControllerDetails, EntryKind, HangingKey, RunState, StatusEntry, is_standby};
use crate::observe::{self, Observed};

/// A snapshot of a controller's counters and queue.
///
/// The counters are final for every reconcile that has returned once
/// [`ControllerHandle::wait_idle`](super::ControllerHandle::wait_idle) returned true.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Reconcile calls that returned (or panicked).
    pub reconciles: u64,
    /// Calls that returned `Ok(Action::Done)` or `Ok(Action::RequeueAfter(_))`
    /// (work done, a resync asked for).
    pub successes: u64,
    /// Calls that returned an error or panicked.
    pub failures: u64,
    /// Calls that returned `Ok(Action::Requeue)` (a rate-limited retry that
    /// is not an error).
    pub requeues: u64,
    /// Failures that were panics.
    pub panics: u64,
    /// Keys ready to be reconciled.
    pub depth: usize,
    /// Keys being reconciled.
    pub processing: usize,
    /// Keys waiting for a due time (retries, delayed enqueues).
    pub waiting: usize,
    /// Ready keys per priority, highest first (priorities with no ready key
    /// left out; before start, every pending key counts as ready).
    pub by_priority: Vec<(i32, usize)>,
    /// Reconciles running longer than the hanging threshold (0 if none is
    /// configured).
    pub hanging: usize,
    /// Keys in the parked set (failed permanently).
    pub parked: usize,
    /// The Display of the last failure (for a panic, its message).
    pub last_error: Option<String>,
    /// When the last failure happened.
    pub last_error_time: Option<SystemTime>,
    /// With a [`store`](crate::Controller::store): keys not yet written,
    /// the last flush, and the last flush error (until one succeeds).
    pub store: Option<crate::observe::reports::StoreStats>,
    /// With a [`leader_election`](crate::Controller::leader_election),
    /// once started: whether this process leads, who does, and the last
    /// error talking to etcd.
    pub leader: Option<crate::observe::reports::LeaderStatus>,
    /// With [`sharding`](crate::Controller::sharding), once started: the
    /// partitions owned, the live replicas, the last error talking to etcd.
    pub shards: Option<crate::observe::reports::ShardStatus>,
    /// Keys dropped because another replica owns them (sharding): enqueues
    /// of keys not ours, and keys whose partition moved before their turn.
    pub not_owned: u64,
    /// Failures of a watched cache's `map` or `predicate` (each logged as
    /// an ERROR; the changed key was enqueued instead).
    pub handler_errors: u64,
    /// Ready keys held by a pending ancestor, or waiting for cancelled
    /// descendants to return (guarantees §14); counted in `depth` too.
    pub held: usize,
    /// Reconciles cancelled because an ancestor became pending (D3) or,
    /// with `supersede`, their key became ready again (U1); counted in
    /// `reconciles` too.
    pub superseded: u64,
    /// Trigger, watch and watchdog threads running (as
    /// [`ControllerHandle::background_threads`](super::ControllerHandle::background_threads)).
    pub background_threads: usize,
}

impl Counters {
    /// Ends a failure streak at a success. No lock; the streak counter is
    /// written only if non-zero, so successes in a row do not bounce its
    /// cache line between workers. (The time of the success is the worker's
    /// own record: see `WorkerMetrics`.)
    pub(crate) fn record_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }
}

impl Stats {
    /// The fields of Python's `stats()` after its name, workers and state,
    /// with the `hanging` keys (this `hanging` counts them), in the walk
    /// every renderer follows (`observe::fields`).
    #[cfg_attr(not(feature = "python"), allow(dead_code))] // Rust reads `Stats` itself
    pub(crate) fn walk<V: Visit>(&self, hanging: &[HangingKey], v: &mut V) -> Result<(), V::Error> {
        v.field("reconciles", Field::Count(self.reconciles))?;
        v.field("successes", Field::Count(self.successes))?;
        v.field("failures", Field::Count(self.failures))?;
        v.field("requeues", Field::Count(self.requeues))?;
        v.field("panics", Field::Count(self.panics))?;
        v.field("depth", Field::size(self.depth))?;
        v.field("processing", Field::size(self.processing))?;
        v.field("waiting", Field::size(self.waiting))?;
        v.field("parked", Field::size(self.parked))?;
        v.field("handler_errors", Field::Count(self.handler_errors))?;
        v.field("held", Field::size(self.held))?;
        v.field("superseded", Field::Count(self.superseded))?;
        v.field("background_threads", Field::size(self.background_threads))?;
        v.field("hanging", Field::Hanging(hanging))?;
        v.field("by_priority", Field::ByPriority(&self.by_priority))?;
        v.field("last_error", Field::maybe_text(&self.last_error))?;
        v.field("last_error_time", Field::Time(self.last_error_time))?;
        walk_scale_out(v, self.store.as_ref(), self.leader.as_ref(), self.shards.as_ref(), self.not_owned)
    }
}

impl<K: ControllerKey> Core<K> {
    /// The wall-clock time of the latest success: the workers stamp it on
    /// the tick clock (no system-clock read per reconcile), converted here.
    fn last_success_time(&self) -> Option<SystemTime> {
        let tick = last_success_tick(self.rt.get()?.slots.iter().map(|slot| &*slot.metrics))?;
        Some(SystemTime::now() - ticks::elapsed_since(tick))
    }
}

impl<K: ControllerKey> Core<K> {
    /// The counters, the queue's sizes and the hanging reconciles, as
    /// [`ControllerHandle::stats`](super::ControllerHandle::stats) and the
    /// status report them. The queue is read before the counters, so the
    /// counters include every reconcile the queue shows as finished (the
    /// worker counts before it marks the key done). Locks are taken one at
    /// a time, briefly.
    pub(crate) fn stats_and_hanging(&self) -> (Stats, Vec<(K, Duration)>) {
        let (depth, held, processing, waiting, by_priority) = match self.rt.get() {
            Some(rt) => {
                let (counts, held) = rt.queue.counts_and_held();
                (counts.ready + held, held, counts.processing, counts.delayed, rt.queue.len_by_priority())
            }
            None => {
                let pending = self.pending.lock();
                let mut by_priority = std::collections::BTreeMap::<i32, usize>::new();
                for (_, _, priority) in pending.iter() {
                    *by_priority.entry(*priority).or_default() += 1;
                }
                (pending.len(), 0, 0, 0, by_priority.into_iter().rev().collect())
            }
        };
        let hanging = self.hanging();
        let c = &self.counters;
        let (last_error, last_error_time) = match c.last_error.lock().clone() {
            Some((e, t)) => (Some(e), Some(t)),
            None => (None, None),
        };
        let results = self
            .rt
            .get()
            .map_or_else(ResultTotals::default, |rt| ResultTotals::sum(rt.slots.iter().map(|slot| &*slot.metrics)));
        let stats = Stats {
            reconciles: results.reconciles() + c.superseded.load(Ordering::Relaxed),
            successes: results.successes(),
            failures: results.failures(),
            requeues: results.requeues(),
            panics: c.panics.load(Ordering::Relaxed),
            depth,
            processing,
            waiting,
            by_priority,
            hanging: hanging.len(),
            parked: self.parked.len(),
            last_error,
            last_error_time,
            store: self.rt.get().and_then(|rt| rt.store.as_ref()).map(|store| store.stats()),
            leader: self.gate().and_then(Gate::leader_status),
            shards: self.gate().and_then(Gate::shard_status),
            not_owned: c.not_owned.load(Ordering::Relaxed),
            handler_errors: self.counters.handler_errors.load(Ordering::Relaxed),
            held,
            superseded: c.superseded.load(Ordering::Relaxed),
            background_threads: self.life.read(|life| life.live_aux),
        };
        (stats, hanging)
    }

    /// Reconciles running longer than the hanging threshold, longest first;
    /// logs the ones not reported yet.
    pub(crate) fn hanging(&self) -> Vec<(K, Duration)> {
        let Some(rt) = self.rt.get() else {
            return Vec::new();
        };
        let Some(threshold) = rt.hanging_threshold else {
            return Vec::new();
        };
        let found = scan(rt, Some(threshold), rt.timeout);
        log_hangs(&self.name, &found.newly);
        found.hanging
    }

    /// Where the controller is in its life; a running one that does not
    /// lead its election is on standby.
    pub(crate) fn run_state(&self) -> RunState {
        match self.life.phase().run_state() {
            RunState::Running if is_standby(self.gate().and_then(Gate::leader_status).as_ref()) => RunState::Standby,
            state => state,
        }
    }

    /// This controller's row in the global status. Hanging keys are
    /// formatted after every lock is released.
    pub(crate) fn status_entry(&self) -> StatusEntry {
        let state = self.run_state();
        let (workers, hanging_threshold) = match self.rt.get() {
            Some(rt) => (rt.workers, rt.hanging_threshold),
            None => {
                let config = self.config.lock();
                (config.workers, config.hanging_threshold)
            }
        };
        let (stats, hanging) = self.stats_and_hanging();
        let details = ControllerDetails {
            state,
            workers,
            reconciles: stats.reconciles,
            requeues: stats.requeues,
            panics: stats.panics,
            depth: stats.depth,
            processing: stats.processing,
            waiting: stats.waiting,
            parked: stats.parked,
            hanging_threshold,
            hanging: hanging.into_iter().map(|(key, running)| HangingKey::new(key, running)).collect(),
            store: stats.store.clone(),
            leader: stats.leader.clone(),
            shards: stats.shards.clone(),
            not_owned: stats.not_owned,
            held: stats.held,
            superseded: stats.superseded,
        };
        let health = Health {
            successes: stats.successes,
            failures: stats.failures,
            consecutive_failures: self.counters.consecutive_failures.load(Ordering::Relaxed),
            last_error: stats.last_error,
            last_error_time: stats.last_error_time,
            last_success_time: self.last_success_time(),
        };
        StatusEntry::new(self.name.clone(), EntryKind::Controller(details), health)
    }
}

impl<K: ControllerKey> Observed for Core<K> {
    fn collect_status(&self, out: &mut Vec<observe::status::StatusEntry>) {
        out.push(self.status_entry());
    }

    fn collect_metrics(&self, out: &mut MetricFamilies) {
        collect_metrics(self, out);
    }

    /// Workers leave only when a stop asks them to (a reconcile's panic is
    /// caught): one gone before that died in the engine itself.
    fn check_live(&self, out: &mut Vec<String>) {
        let Some(rt) = self.rt.get() else { return };
        let live_workers = self.life.read(|life| (life.phase == Phase::Running).then_some(life.live_workers));
        if let Some(live) = live_workers.filter(|&live| live < rt.workers) {
            out.push(format!(
                "controller {:?}: {} of {} worker threads exited",
                self.name,
                rt.workers - live,
                rt.workers
            ));
        }
    }
}

/// Adds `core`'s samples, labelled `controller`.
fn collect_metrics<K: ControllerKey>(core: &Core<K>, out: &mut MetricFamilies) {
    let controller = core.name.as_str();
    let labels = [("controller", controller)];
    let mut results = ResultTotals::default();
    let mut terminal = 0;
    let mut active = 0;
    let mut held = 0;
    let mut reconcile_time = WorkerHistogram::<RECONCILE_N>::new(&RECONCILE_BUCKETS).snapshot();
    let workers = match core.rt.get() {
        Some(rt) => {
            results = ResultTotals::sum(rt.slots.iter().map(|slot| &*slot.metrics));
            for slot in &rt.slots {
                terminal += slot.metrics.terminal.load(Ordering::Relaxed);
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
        core.counters.panics.load(Ordering::Relaxed) as f64,
    );
    if core.rt.get().is_some_and(|rt| rt.timeout.is_some()) {
        out.counter(
            "controller_runtime_reconcile_timeouts_total",
            "Total number of reconciliations cancelled at their timeout per controller",
            &labels,
            core.counters.timeouts.load(Ordering::Relaxed) as f64,
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
        core.counters.superseded.load(Ordering::Relaxed) as f64,
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
