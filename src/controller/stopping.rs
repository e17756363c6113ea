//! A stop in progress ([`Stopping`]), driven by whoever waits for it in
//! slices: so a caller that must look up between waits (Python's Ctrl-C)
//! needs no helper thread and no flags of its own.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::core::{ControllerKey, Core, Runtime};
use super::features::Features;
use super::life::Phase;
use crate::clock::deadline_after;
use crate::logs;

/// How often a stop waiting for reconciles logs which ones it waits for.
const STOP_WAIT_LOG_INTERVAL: Duration = Duration::from_secs(3);

/// How [`ControllerHandle::stop_with`](super::ControllerHandle::stop_with) stops.
///
/// Exhaustive, so that a literal names every choice (a caller that takes
/// the defaults for the rest writes `..StopOptions::default()`, which a
/// later option will keep working with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StopOptions {
    /// Reconcile the keys ready now first (as
    /// [`stop_with_drain_report`](super::ControllerHandle::stop_with_drain_report)),
    /// or stop at once (as [`stop`](super::ControllerHandle::stop)).
    pub drain: bool,
    /// When to give up on the workers (real time; `None`: never). A drain
    /// then cancels what runs and drops what is ready.
    pub timeout: Option<Duration>,
    /// How long to wait for trigger, watch and watchdog threads once the
    /// workers are done (`None`: until the timeout); those still running
    /// then are detached.
    pub aux_grace: Option<Duration>,
}

/// What [`ControllerHandle::stop_with_drain_report`](super::ControllerHandle::stop_with_drain_report) found.
///
/// Exhaustive: tests compare a stop's whole report with a literal; a new
/// field is a breaking change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopReport<K> {
    /// Every worker finished before the deadline.
    pub finished: bool,
    /// Keys whose reconcile was still running at the deadline (their workers
    /// were cancelled and detached).
    pub unfinished: Vec<K>,
    /// Trigger and watch threads still running at the deadline, detached
    /// (typically a watch blocked on an iterator that never yields).
    pub detached_threads: usize,
    /// Caches this stop stopped (no other controller used them, and they
    /// were not [`start`](crate::Cache::start)ed) whose thread was still
    /// in its source at the deadline: a source that does not heed its
    /// [`Stop`](crate::source::Stop). Left behind, it applies and delivers
    /// nothing more and exits when the source returns. By name.
    pub unfinished_caches: Vec<String>,
    /// Keys the stop dropped without reconciling them: keys waiting on a
    /// delay or a retry back-off, and ready keys left at the deadline.
    /// Enqueue them again after a restart if they matter.
    pub dropped: Vec<K>,
    /// With a [`store`](crate::Controller::store): why the stop's last
    /// flush failed (then the file keeps what the last successful flush
    /// wrote, and `stats().store` shows the keys not written). `None` if it
    /// succeeded, or had not run by the deadline (it runs once the workers
    /// have exited).
    pub store_error: Option<String>,
}

impl<K> StopReport<K> {
    /// Every worker finished, nothing was dropped or detached.
    pub(crate) fn finished_with_nothing_left() -> Self {
        Self {
            finished: true,
            unfinished: Vec::new(),
            detached_threads: 0,
            unfinished_caches: Vec::new(),
            dropped: Vec::new(),
            store_error: None,
        }
    }
}

/// A stop under way: [`wait`](Self::wait) drives it to its report.
#[must_use = "the stop is requested, but only `.wait()` joins the threads and reports what was left"]
pub struct Stopping<K: ControllerKey> {
    core: Arc<Core<K>>,
    features: Arc<Features<K>>,
    drain: bool,
    deadline: Instant,
    aux_grace: Option<Duration>,
    step: Step,
    report: StopReport<K>,
}

impl<K: ControllerKey> fmt::Debug for Stopping<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stopping")
            .field("controller", &self.core.name)
            .field("drain", &self.drain)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// The queue drains; `next_log` is when to say what runs.
    Draining {
        next_log: Instant,
    },
    /// Waiting for the workers to exit.
    Workers,
    /// Waiting for the auxiliary threads until `until`.
    Aux {
        until: Instant,
    },
    Done,
}

/// What one step of the stop did.
enum Moved {
    On(Step),
    /// The caller's slice ended first.
    SliceOver,
}

impl<K: ControllerKey> Stopping<K> {
    /// Requests the stop (a stop at once was already made by the caller)
    /// and returns it under way.
    pub(crate) fn begin(core: Arc<Core<K>>, features: Arc<Features<K>>, options: StopOptions) -> Self {
        let now = Instant::now();
        let deadline = deadline_after(now, options.timeout.unwrap_or(Duration::MAX));
        let step = if options.drain {
            core.request_stop();
            match core.rt.get() {
                Some(rt) => {
                    // Closes the queue for the drain; `wait` waits for it.
                    rt.queue.shut_down_with_drain_timeout(Duration::ZERO);
                    Step::Draining { next_log: deadline_after(now, STOP_WAIT_LOG_INTERVAL) }
                }
                None => Step::Aux { until: deadline },
            }
        } else {
            Step::Workers
        };
        Self {
            core,
            features,
            drain: options.drain,
            deadline,
            aux_grace: options.aux_grace,
            step,
            report: StopReport::finished_with_nothing_left(),
        }
    }

    /// Waits for the stop at most `slice` (real time); its report once it is
    /// done (again on every later call), `None` if the slice ended first.
    pub fn wait(&mut self, slice: Duration) -> Option<StopReport<K>> {
        let slice_end = deadline_after(Instant::now(), slice);
        loop {
            let until = slice_end.min(self.deadline);
            let moved = match self.step {
                Step::Draining { next_log } => self.drain(next_log, until),
                Step::Workers => self.workers(until),
                Step::Aux { until: aux_until } => self.aux(aux_until, until),
                Step::Done => {
                    self.report.store_error = self.store_error();
                    return Some(self.report.clone());
                }
            };
            match moved {
                Moved::On(step) => self.step = step,
                Moved::SliceOver => return None,
            }
        }
    }

    fn rt(&self) -> &Runtime<K> {
        runtime(&self.core)
    }

    /// The store's last flush error, if it has one.
    fn store_error(&self) -> Option<String> {
        self.core.rt.get()?.store.as_ref()?.stats().error
    }

    /// Waits for the queue to drain, saying every few seconds what runs.
    fn drain(&self, next_log: Instant, until: Instant) -> Moved {
        let rt = self.rt();
        let now = Instant::now();
        let until = until.min(next_log);
        let drained = rt.queue.shut_down_with_drain_timeout(until.saturating_duration_since(now));
        // Back before its time without draining: the queue is not draining
        // (an immediate stop came first); nothing to wait for.
        let now = Instant::now();
        if drained || now < until || now >= self.deadline {
            return Moved::On(Step::Workers);
        }
        if now >= next_log {
            logs::stop_waiting(&self.core.name, &running_keys(rt));
            return Moved::On(Step::Draining { next_log: deadline_after(now, STOP_WAIT_LOG_INTERVAL) });
        }
        Moved::SliceOver
    }

    /// Waits for the workers; at the deadline a drain gives up on them.
    fn workers(&mut self, until: Instant) -> Moved {
        let life = &self.core.life;
        let drain = self.drain;
        let exited = life
            .wait_until(Some(until), |life| if drain { life.live_workers == 0 } else { life.phase == Phase::Stopped });
        let now = Instant::now();
        if !exited && now < self.deadline {
            return Moved::SliceOver;
        }
        self.report.finished = exited;
        if drain {
            let rt = runtime(&self.core);
            let name = &self.core.name;
            if exited {
                life.join_workers();
                // Keys still ready were held back by a gate (caches not
                // synced, a standby) from workers now gone: dropped, and
                // reported as such.
                rt.queue.shut_down_now();
            } else {
                self.core.cancel_everything();
                rt.queue.shut_down_now();
                self.report.unfinished = running_keys(rt);
                life.abandon();
                logs::drain_deadline_passed(name, &self.report.unfinished);
            }
            self.report.dropped = self.core.take_dropped(rt);
            logs::stop_dropped(name, &self.report.dropped);
        } else if !exited {
            // Stopped at once, and not in time: nothing more to wait for.
            return Moved::On(Step::Done);
        }
        let grace_end = self.aux_grace.map_or(self.deadline, |grace| deadline_after(now, grace));
        Moved::On(Step::Aux { until: self.deadline.min(grace_end) })
    }

    /// Waits for the trigger, watch and watchdog threads, and for the
    /// threads of the caches the stop let go of, until `aux_until`; those
    /// still running then are detached (and reported).
    fn aux(&mut self, aux_until: Instant, until: Instant) -> Moved {
        let core = &self.core;
        let life = &core.life;
        // A stop at once joins the workers here, with the rest.
        let workers_too = !self.drain;
        let wait_until = until.min(aux_until);
        let threads_done =
            life.wait_until(Some(wait_until), |life| life.live_aux == 0 && (!workers_too || life.live_workers == 0));
        let caches_left = self.features.watches.caches_still_running(wait_until);
        if !(threads_done && caches_left.is_empty()) && Instant::now() < aux_until {
            return Moved::SliceOver;
        }
        if threads_done {
            if workers_too {
                life.join_workers();
            }
            life.join_aux();
        } else {
            self.report.detached_threads = life.read(|life| life.live_aux);
        }
        logs::stop_left_caches(&core.name, &caches_left);
        self.report.unfinished_caches = caches_left;
        Moved::On(Step::Done)
    }
}

/// The runtime of a controller whose stop reached its workers.
fn runtime<K>(core: &Core<K>) -> &Runtime<K> {
    core.rt.get().expect("a stop with workers has a runtime")
}

/// The keys whose reconcile is running now.
pub(crate) fn running_keys<K: Clone>(rt: &Runtime<K>) -> Vec<K> {
    rt.slots.iter().filter_map(|slot| slot.running.lock().as_ref().map(|r| r.key.clone())).collect()
}
