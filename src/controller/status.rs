//! A controller's row in the global status ([`crate::status`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::watchdog::{log_hangs, scan};
use super::{ControllerKey, Core, Counters};
use crate::observe::status::{ControllerDetails, EntryKind, HangingKey, RunState, StatusEntry};

impl Counters {
    /// Counts a success for the status: the time, and the end of a failure
    /// streak. No lock; the streak counter is written only if non-zero, so
    /// successes in a row do not bounce its cache line between workers.
    pub(crate) fn record_success(&self) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| (d.as_nanos() as u64).max(1));
        self.last_success.store(now, Ordering::Relaxed);
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    fn last_success_time(&self) -> Option<SystemTime> {
        match self.last_success.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(UNIX_EPOCH + Duration::from_nanos(nanos)),
        }
    }
}

impl<K: ControllerKey> Core<K> {
    /// Takes the controller's locks one at a time, briefly; formats hanging
    /// keys after releasing them. The queue is read before the counters, so
    /// the counters include every reconcile the queue shows as finished
    /// (the worker counts before it marks the key done).
    pub(crate) fn status_entry(&self) -> StatusEntry {
        let state = {
            let life = self.life.lock();
            if life.is_stopped() {
                RunState::Stopped
            } else if life.stop_requested {
                RunState::Stopping
            } else if self.rt.get().is_none() {
                RunState::NotStarted
            } else {
                RunState::Running
            }
        };
        let (workers, hanging_threshold, depth, processing, waiting, hanging) = match self.rt.get() {
            Some(rt) => {
                let counts = rt.queue.counts();
                let hanging = match rt.hanging_threshold {
                    Some(threshold) => {
                        let found = scan(rt, threshold);
                        log_hangs(&self.name, &found.newly);
                        found.hanging
                    }
                    None => Vec::new(),
                };
                (rt.workers, rt.hanging_threshold, counts.ready, counts.processing, counts.delayed, hanging)
            }
            None => {
                let config = self.config.lock().clone();
                (config.workers, config.hanging_threshold, self.pending.lock().len(), 0, 0, Vec::new())
            }
        };
        let c = &self.counters;
        let (last_error, last_error_time) = match c.last_error.lock().clone() {
            Some((e, t)) => (Some(e), Some(t)),
            None => (None, None),
        };
        let details = ControllerDetails {
            state,
            workers,
            reconciles: c.reconciles.load(Ordering::Relaxed),
            requeues: c.requeues.load(Ordering::Relaxed),
            panics: c.panics.load(Ordering::Relaxed),
            depth,
            processing,
            waiting,
            parked: self.parked.len(),
            hanging_threshold,
            hanging: hanging.into_iter().map(|(key, running)| HangingKey::new(key, running)).collect(),
        };
        StatusEntry {
            name: self.name.clone(),
            kind: EntryKind::Controller(details),
            successes: c.successes.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            consecutive_failures: c.consecutive_failures.load(Ordering::Relaxed),
            last_error,
            last_error_time,
            last_success_time: c.last_success_time(),
        }
    }
}
