//! The worker loop: take a key, reconcile it, act on the result, repeat.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::core::{ControllerKey, Core, Running, Runtime, Started, WorkerSlot};
use super::finish::Settled;
use super::gate::{Admission, Gate};
use super::metrics::Counted;
use super::outcome::{Outcome, Reconciler, RetryPolicy};
use crate::context::Context;
use crate::logs;
use crate::observe::metrics::ticks;
use crate::queue::Priority;

crate::sync::thread_local! {
    /// The address of the controller core this thread is a worker of (0 on
    /// other threads), so a call that would wait for this very worker (a
    /// `wait_idle` from its own reconcile) can tell and refuse instead of
    /// deadlocking. Thread names cannot tell: two controllers may share one.
    static WORKER_OF: Cell<usize> = const { Cell::new(0) };
}

crate::sync::thread_local! {
    /// The address of the [`WorkerSlot`] this thread works in (0 on other
    /// threads), set once per worker: U1 spares a reconcile that enqueues
    /// its own key, and nothing is written per reconcile to know it.
    static WORKER_SLOT: Cell<usize> = const { Cell::new(0) };
}

/// Whether the calling thread is the worker of `slot` (so a reconcile
/// running there is the caller's own).
pub(crate) fn on_slot<K>(slot: &WorkerSlot<K>) -> bool {
    WORKER_SLOT.with(|on| on.get() == std::ptr::from_ref(slot).addr())
}

/// Whether the calling thread is one of `core`'s workers.
pub(crate) fn on_worker_of<K>(core: &Core<K>) -> bool {
    WORKER_OF.with(|of| of.get() == core_address(core))
}

fn core_address<K>(core: &Core<K>) -> usize {
    std::ptr::from_ref(core).addr()
}

/// Runs worker `index` until the queue shuts down.
pub(crate) fn run_worker<K: ControllerKey>(core: &Core<K>, reconciler: &dyn Reconciler<K>, index: usize) {
    WORKER_OF.with(|of| of.set(core_address(core)));
    let rt = core.rt.get().expect("the runtime is set before workers start");
    let slot = &rt.slots[index];
    WORKER_SLOT.with(|on| on.set(std::ptr::from_ref(slot).addr()));
    let mut ctx = Context::with_signal(0, slot.signal.clone());
    let mut next = rt.queue.get_with_priority();
    let mut started = ticks::now();
    while let Some((key, priority)) = next {
        begin(core, rt, slot, &key, started);
        // Asked after `begin`: a leadership lost after this answer cancels
        // this reconcile (the loss clears the token, then cancels what its
        // callback finds running, and `begin` made us findable).
        if let Some(coordination) = &rt.coordination {
            match coordination.gate.admit(&key) {
                Admission::Run(token) => ctx.fencing_token = token,
                Admission::Wait => {
                    slot.running.lock().take();
                    next = stand_by(core, rt, &*coordination.gate, key, priority);
                    started = ticks::now();
                    continue;
                }
                Admission::Drop => {
                    slot.running.lock().take();
                    core.counters.not_owned.fetch_add(1, Ordering::Relaxed);
                    (next, started) = core.finish(rt, &key, Settled::NotOurs, ticks::now());
                    continue;
                }
            }
        }
        // A parked key that was enqueued again is no longer parked.
        core.parked.unpark(&key);
        ctx.attempt = core.memory.attempts(&key);
        // Only a retry has a previous error (one more lookup, off the hot
        // path of first tries).
        ctx.previous_error = if ctx.attempt > 0 { core.memory.get(&key).last_error } else { None };
        ctx.priority = priority;
        // The reconcile and the handling of its result run in the span; the
        // queue calls around them do not (no logging under engine locks:
        // see `crate::logs`).
        let span = logs::reconcile_span(&core.name, &key, ctx.attempt);
        let entered = span.enter();
        let result = catch_unwind(AssertUnwindSafe(|| reconciler.reconcile(&key, &ctx)));
        let (timed_out, superseded) =
            slot.running.lock().take().map_or((false, false), |run| (run.timed_out, run.superseded));
        let outcome = match rt.timeout {
            Some(timeout) if timed_out => {
                core.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                Outcome::timed_out(timeout)
            }
            _ => Outcome::classify(result),
        };
        let counted = Counted::of(&outcome);
        let settled = if superseded {
            // Neither success nor failure: the error, the limiter and the
            // attempt stay as they were; an ancestor's run brings the key
            // back (D2), or the enqueue that superseded it (U1).
            core.count_superseded();
            Settled::Superseded
        } else {
            settle(core, rt, &key, &ctx, outcome, timed_out)
        };
        if let (Some(coordination), Some(token)) = (&rt.coordination, ctx.fencing_token) {
            coordination.gate.finished(&key, token);
        }
        drop(entered);
        // One clock reading ends this reconcile's time and stamps `done`
        // and the next hand-out, which starts the next reconcile's time.
        let finished = ticks::now();
        if settled != Settled::Superseded {
            slot.metrics.record(started, finished, counted);
        }
        // The retry is scheduled and the stats counted before `done`, so a
        // `wait_idle` that sees the queue idle also sees the stats.
        (next, started) = core.finish(rt, &key, settled, finished);
    }
}

/// A key was handed out while this process does not lead: put it back
/// (it stays ready, at its priority), wait for leadership without CPU, and
/// take the next key. `None` once the controller stops.
fn stand_by<K: ControllerKey>(
    core: &Core<K>,
    rt: &Runtime<K>,
    gate: &dyn Gate<K>,
    key: K,
    priority: Priority,
) -> Option<(K, Priority)> {
    // An add while the key is processing marks it dirty; `done` makes it
    // ready again.
    rt.queue.add_with_priority(key.clone(), priority);
    rt.queue.done(&key);
    if !gate.wait(&|| core.life.is_stopping()) {
        return None;
    }
    rt.queue.get_with_priority()
}

/// Makes the reconcile of `key`, handed out at tick `tick`, visible to
/// other threads.
fn begin<K: ControllerKey>(core: &Core<K>, rt: &Runtime<K>, slot: &WorkerSlot<K>, key: &K, tick: u64) {
    let started = if rt.clock.is_real_time() { Started::Tick(tick) } else { Started::At(rt.clock.now()) };
    {
        let mut running = slot.running.lock();
        *running = Some(Running { key: key.clone(), started, hang_logged: false, timed_out: false, superseded: false });
        // Under the slot lock, so a concurrent `cancel_all` either sees this
        // reconcile or we see its flag.
        slot.signal.reset_to(core.life.cancel_all.load(Ordering::SeqCst));
    }
    if let Some(watchdog) = &rt.watchdog {
        watchdog.kick_if_idle();
    }
}

/// Acts on a finished reconcile (guarantees §4's table). Retries keep the priority
/// the key was handed out with (P3). Says whether the key's run of
/// attempts ended (then its dependents follow, D2: `Core::finish`).
fn settle<K: ControllerKey>(
    core: &Core<K>,
    rt: &Runtime<K>,
    key: &K,
    ctx: &Context,
    outcome: Outcome,
    timed_out: bool,
) -> Settled {
    let counters = &core.counters;
    let (attempt, priority) = (ctx.attempt, ctx.priority);
    match outcome {
        Outcome::Success => {
            // At attempt 0 the limiter was not asked about the key since the
            // controller last forgot it, so there is nothing to forget (this
            // saves a locked map lookup per success on the hot path).
            if attempt > 0 {
                core.memory.clear(key);
                rt.queue.forget(key);
            }
            counters.record_success();
            Settled::Ended
        }
        Outcome::Requeue => {
            core.memory.bump(key, None);
            rt.retry_rate_limited(key, attempt, priority);
            Settled::Retried
        }
        Outcome::RequeueAfter(delay) => {
            // The reconcile did its work and asks for a periodic resync: a
            // success (controller-runtime counts it apart from errors; its
            // metric label stays `requeue_after`).
            core.memory.clear(key);
            rt.queue.forget(key);
            rt.retry_after(key, delay, priority);
            counters.record_success();
            Settled::Ended
        }
        Outcome::Failure { retry, message, panicked } => {
            if panicked {
                counters.panics.fetch_add(1, Ordering::Relaxed);
            }
            if panicked || timed_out || rt.log_errors {
                let previous = ctx.previous_error.as_deref();
                logs::reconcile_failed(&core.name, key, attempt, retry.into(), &message, panicked, previous);
            }
            let settled = match retry {
                RetryPolicy::RateLimited => {
                    core.memory.bump(key, Some(message.clone()));
                    rt.retry_rate_limited(key, attempt, priority);
                    Settled::Retried
                }
                RetryPolicy::After(delay) => {
                    core.memory.bump(key, Some(message.clone()));
                    rt.retry_after(key, rt.jittered(key, attempt, delay), priority);
                    Settled::Retried
                }
                RetryPolicy::Never => {
                    core.memory.clear(key);
                    rt.queue.forget(key);
                    core.parked.park(key.clone(), message.clone());
                    Settled::Ended
                }
            };
            *counters.last_error.lock() = Some((message, SystemTime::now()));
            counters.consecutive_failures.fetch_add(1, Ordering::Relaxed);
            settled
        }
    }
}
