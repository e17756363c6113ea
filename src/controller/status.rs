//! A controller's row in the global status ([`crate::status`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::gate::Gate;
use super::metrics::{ResultTotals, last_success_tick};
use super::watchdog::{log_hangs, scan};
use super::{ControllerKey, Core, Counters, Stats};
use crate::observe::fields::{Field, Health, Visit, walk_scale_out};
use crate::observe::metrics::ticks;
use crate::observe::status::{ControllerDetails, EntryKind, HangingKey, RunState, StatusEntry, is_standby};

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
        let tick = last_success_tick(&self.rt.get()?.slots)?;
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
        let results = self.rt.get().map_or_else(ResultTotals::default, |rt| ResultTotals::sum(&rt.slots));
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
            handler_errors: self.watches.handler_errors(),
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
