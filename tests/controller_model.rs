//! State-machine property test of the `Controller` (reliability issue):
//! random operation sequences on a one-worker controller with a `FakeClock`
//! and `ExponentialBackoff(1 s, 1000 s)` over keys 0..4, checked after every
//! step against a reference model of guarantees §1 (G1-G5, G7, G9) and §4's result
//! table.
//!
//! One worker makes the order deterministic. After each operation the test
//! waits until nothing is ready or processing (the fake clock does not move,
//! so delayed keys stay put) and compares:
//! every reconcile call so far (key, `Context::attempt()`, `is_cancelled()`,
//! in order), `stats()` (reconciles, successes, failures, requeues, panics,
//! depth, processing, waiting, parked, last_error), `parked()` (oldest
//! first), and `inspect(k)` for every key (state with the exact due instant,
//! attempts, last_error, next_run).
//!
//! **Gates** make the in-flight cases deterministic: the next reconcile of a
//! key blocks until released, and a batch of operations runs meanwhile. That
//! covers adds of ready keys (G1 dedup), adds and delayed adds of the key
//! being processed (G2/G3: it runs again after, once; a delay waits), FIFO
//! order of keys made ready while the worker is busy (G4), `cancel` of the
//! running key (true, `is_cancelled()` seen) and of others (false), and a
//! result's retry colliding with an add made while it ran.
//!
//! What the model encodes:
//! * Result table: `Done` forgets (attempt and limiter reset, memory
//!   cleared), success. `Requeue` is a rate-limited add (delay = the key's
//!   backoff sequence 1, 2, 4, ... s), requeue, attempt + 1. `RequeueAfter(d)`
//!   forgets and adds after `d`, success. An error is a rate-limited add,
//!   failure; a panic is the same plus `panics` (G9: the worker goes on).
//!   `retry_after(d)` adds after `d`, failure, attempt + 1 without asking the
//!   limiter. `permanent` forgets, parks the key (no retry), failure. A parked
//!   key leaves the parked set when it is handed out again
//!   (`requeue_parked`, or any enqueue).
//! * Queue rules: dedup of waiting keys (G1); a key added while processed
//!   runs once more after (G2/G3); FIFO of ready keys (G4); `d = 0` or a past
//!   instant is now, the earliest due time wins, a plain add of a delayed key
//!   makes it ready and cancels the delay, a delayed add of a ready key does
//!   nothing (G5). Keys due at the same instant come out in the order their
//!   due times were set (the engine's tie-break; the spec leaves it open).
//! * Supersede (U1), in half the cases (`supersede=true`): an add of the
//!   key being reconciled, or its delay coming due (a fake clock's advance
//!   promotes at once), cancels the run (its call sees `is_cancelled()`),
//!   which then counts as `superseded` and in `reconciles`, whatever its
//!   scripted result: attempt, limiter, last error and parked keys stay as
//!   they were, and the key runs again with the higher of the two
//!   priorities. The result's own re-add supersedes nothing.
//! * Batches (U3): `Op::Batch` opens a `batch()`, runs a few operations
//!   (some from another thread) and closes it. Nothing becomes ready for
//!   the worker meanwhile, so the keys made ready come out at the close by
//!   priority, then by the time they became ready; a raise inside the
//!   batch keeps a key's place (the engine's choice; the spec leaves it
//!   open).
//! * Stopping (G7), as the last operation, idle or while a gated reconcile
//!   runs: `stop()` drops ready and delayed keys and cancels the running
//!   reconcile; `stop_with_drain` drops delayed keys, reconciles the ready
//!   ones and the running key again if it was dirty, without retries, and
//!   returns true. After either, enqueues are ignored.
//!
//! A second property test, `group_limits_hold_under_random_load`, runs
//! several workers for real with `group` and `max_in_flight_per_group`
//! (P4, P5): random enqueues at random priorities, keys that fail or
//! requeue a few times, enqueues racing the reconciles. Exact order is not
//! deterministic there, so it checks what must always hold: never more
//! than the limit of one group at once, never one key twice at once (G2),
//! every enqueue followed by a reconcile that saw it (G3), and the
//! controller going idle (a key of a full group left stranded would stop
//! that).
//!
//! A third, `dependencies_hold_under_random_graphs`, does the same for
//! dependencies between keys (guarantees §14) under random graphs, with
//! permanent errors, with or without `supersede`, with or without two
//! groups of one key in flight: no key starts while an ancestor or a
//! descendant runs (D1, D3), each child runs again after its parent's last
//! run (D2), every edge's reverse is refused as a cycle (D4), every
//! reconcile is counted once (superseded included), nothing is left held
//! (or stranded).
//!
//! Single-bug mutants tried (each put in by hand, the test run with its
//! default cases, the change reverted); all caught:
//! * `controller_matches_the_model`: supersede not cancelling the run
//!   (`supersede_run` a no-op); a superseded run bumping the rate limiter
//!   (`limiter.when` after `count_superseded`: the next back-off is
//!   longer); one bumping `attempt`; one settled as its result (counted as
//!   success or failure); a superseded key coming back at the add's
//!   priority instead of the higher one; a batch holding nothing; a batch
//!   not holding keys enqueued from another thread (held only for named
//!   threads).
//! * `dependencies_hold_under_random_graphs`: D2's dependents not enqueued
//!   after a permanent error; a held key taking its group's room (counted
//!   in flight while held: the group's other keys are stranded). Earlier:
//!   holding nothing (D1), no D2, no wait for cancelled descendants (D3),
//!   ready descendants not held.
//!
//! Left to other tests: several workers and real concurrency
//! (`controller_concurrency.rs`, `shuttle.rs`), the queue on its own
//! (`model.rs`), drain deadlines and hung reconciles (`controller_stop.rs`),
//! jitter, other limiters, triggers, the hang watchdog, the Python surface,
//! G8 (`idle_cpu.rs`), groups (`groups.rs`, `shuttle_controller.rs`).
//!
//! Priorities (guarantees §8, P1-P3) are part of the model: enqueues carry a
//! priority in 0..3, every call records the priority it was handed out
//! with, and the model hands out the highest priority first, FIFO by the
//! time a key became ready (or was raised) within one; adds raise, never
//! lower (P2); a key added while processed comes back with the highest
//! priority given meanwhile; retries and requeues re-add with the priority
//! handed out (P3).

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Once};
use std::thread;
use std::time::{Duration, Instant};

use common::{PATIENCE, secs};
use parking_lot::{Condvar, Mutex};
use proptest::prelude::*;
use reconq::{
    Action, Context, Controller, ControllerHandle, ExponentialBackoff, FakeClock, KeyInfo, KeyStatus, ReconcileError,
    Reconciler,
};

const KEYS: u32 = 4;
/// A key the model never sees: its removal shows that a drain has begun.
const SENTINEL: u32 = 100;
const NAME: &str = "ctlmodel";

// ---------------------------------------------------------------------------
// Operations

/// What the next reconcile of a key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Res {
    Done,
    Requeue,
    RequeueAfter(u64),
    Fail,
    RetryAfter(u64),
    Permanent,
    Panic,
}

/// An operation that needs no quiescence before it (it may run while a gated
/// reconcile is in flight).
#[derive(Debug, Clone)]
enum Inner {
    /// Key and priority.
    Enqueue(u32, i32),
    EnqueueAfter(u32, u64, i32),
    /// Offset in seconds from the clock's now (negative: in the past).
    EnqueueAt(u32, i64, i32),
    Advance(u64),
    /// Advance to the earliest due time (no-op if none): keeps retry chains
    /// going, so long backoff sequences are reached.
    AdvanceToNext,
    /// Append these results to the key's script (default: `Done`).
    SetResults(u32, Vec<Res>),
    RequeueParked(u32),
    Cancel(u32),
}

#[derive(Debug, Clone)]
enum Op {
    Do(Inner),
    /// Enqueue the key, block its reconcile, run the batch, release.
    Gate(u32, Vec<Inner>),
    /// Open a `batch()` (U3), run the operations (those marked `true` on
    /// another thread, one after the other), close it.
    Batch(Vec<(Inner, bool)>),
}

#[derive(Debug, Clone)]
enum End {
    Stop,
    Drain,
    /// `stop()` while the key's reconcile is blocked after the batch.
    StopGated(u32, Vec<Inner>),
    /// `stop_with_drain` while the key's reconcile is blocked after the batch.
    DrainGated(u32, Vec<Inner>),
}

fn key() -> impl Strategy<Value = u32> {
    0..KEYS
}

/// Mostly the default priority, so FIFO order still gets exercised.
fn priority() -> impl Strategy<Value = i32> {
    prop_oneof![3 => Just(0), 1 => Just(1), 1 => Just(2)]
}

fn res() -> impl Strategy<Value = Res> {
    prop_oneof![
        2 => Just(Res::Done),
        2 => Just(Res::Requeue),
        2 => (0..4u64).prop_map(Res::RequeueAfter),
        3 => Just(Res::Fail),
        2 => (0..4u64).prop_map(Res::RetryAfter),
        2 => Just(Res::Permanent),
        1 => Just(Res::Panic),
    ]
}

fn inner() -> impl Strategy<Value = Inner> {
    prop_oneof![
        3 => (key(), priority()).prop_map(|(k, p)| Inner::Enqueue(k, p)),
        2 => (key(), 0..6u64, priority()).prop_map(|(k, d, p)| Inner::EnqueueAfter(k, d, p)),
        1 => (key(), -3..6i64, priority()).prop_map(|(k, o, p)| Inner::EnqueueAt(k, o, p)),
        2 => (0..9u64).prop_map(Inner::Advance),
        2 => Just(Inner::AdvanceToNext),
        5 => (key(), prop::collection::vec(res(), 1..5)).prop_map(|(k, r)| Inner::SetResults(k, r)),
        1 => key().prop_map(Inner::RequeueParked),
        1 => key().prop_map(Inner::Cancel),
    ]
}

fn batch() -> impl Strategy<Value = Vec<Inner>> {
    prop::collection::vec(inner(), 0..6)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => inner().prop_map(Op::Do),
        2 => (key(), batch()).prop_map(|(k, b)| Op::Gate(k, b)),
        1 => prop::collection::vec((inner(), any::<bool>()), 0..6).prop_map(Op::Batch),
    ]
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        Just(End::Stop),
        Just(End::Drain),
        (key(), batch()).prop_map(|(k, b)| End::StopGated(k, b)),
        (key(), batch()).prop_map(|(k, b)| End::DrainGated(k, b)),
    ]
}

// ---------------------------------------------------------------------------
// The reconciler under test: per-key scripts, a call log, gates.

#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    key: u32,
    attempt: u32,
    cancelled: bool,
    priority: i32,
}

#[derive(Default)]
struct GateState {
    key: Option<u32>,
    entered: bool,
    released: bool,
}

#[derive(Default)]
struct Shared {
    script: Mutex<HashMap<u32, VecDeque<Res>>>,
    calls: Mutex<Vec<Call>>,
    gate: Mutex<GateState>,
    gate_cv: Condvar,
}

#[derive(Clone, Default)]
struct Rec(Arc<Shared>);

fn message(kind: &str, key: u32, index: usize) -> String {
    format!("{kind}-{key}-{index}")
}

impl Reconciler<u32> for Rec {
    fn reconcile(&self, key: &u32, ctx: &Context) -> Result<Action, ReconcileError> {
        {
            let mut g = self.0.gate.lock();
            if g.key == Some(*key) && !g.entered {
                g.entered = true;
                self.0.gate_cv.notify_all();
                while !g.released {
                    self.0.gate_cv.wait(&mut g);
                }
            }
        }
        let res = self.0.script.lock().get_mut(key).and_then(VecDeque::pop_front).unwrap_or(Res::Done);
        let index = {
            let mut calls = self.0.calls.lock();
            calls.push(Call {
                key: *key,
                attempt: ctx.attempt(),
                cancelled: ctx.is_cancelled(),
                priority: ctx.priority(),
            });
            calls.len() - 1
        };
        match res {
            Res::Done => Ok(Action::Done),
            Res::Requeue => Ok(Action::Requeue),
            Res::RequeueAfter(d) => Ok(Action::RequeueAfter(secs(d))),
            Res::Fail => Err(ReconcileError::new(message("fail", *key, index))),
            Res::RetryAfter(d) => Err(ReconcileError::retry_after(secs(d), message("retry", *key, index))),
            Res::Permanent => Err(ReconcileError::permanent(message("perm", *key, index))),
            Res::Panic => panic!("{}", message("panic", *key, index)),
        }
    }
}

impl Rec {
    fn arm(&self, key: u32) {
        *self.0.gate.lock() = GateState { key: Some(key), entered: false, released: false };
    }

    fn wait_entered(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut g = self.0.gate.lock();
        while !g.entered {
            assert!(!self.0.gate_cv.wait_until(&mut g, deadline).timed_out(), "gated reconcile never started");
        }
    }

    fn release(&self) {
        let mut g = self.0.gate.lock();
        g.released = true;
        self.0.gate_cv.notify_all();
    }
}

// ---------------------------------------------------------------------------
// The reference model. Times are whole seconds since the clock's start.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Finish,
    Requeue,
    Wait(u64, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Its priority.
    Ready(i32),
    /// Due time, scheduling sequence (ties come out in scheduling order)
    /// and priority.
    Delayed(u64, u64, i32),
    /// What follows, and the priority it comes back with.
    Processing(Then, i32),
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Counts {
    reconciles: u64,
    successes: u64,
    failures: u64,
    requeues: u64,
    panics: u64,
    superseded: u64,
}

#[derive(Default)]
struct Model {
    /// The controller's `supersede` (U1).
    supersede: bool,
    /// U1: the running reconcile was cancelled by its key becoming ready.
    superseding: bool,
    /// A `batch()` is open (U3): ready keys wait for its close. The
    /// model's worker only runs between operations, so that is all it
    /// changes: a raise keeps a held key's place.
    batch: bool,
    now: u64,
    seq: u64,
    slots: HashMap<u32, Slot>,
    /// Ready keys with their priority and the order they became ready (or
    /// were raised) in: handed out highest priority first, then oldest.
    ready: Vec<(i32, u64, u32)>,
    ready_seq: u64,
    shutting_down: bool,
    /// Tries since the last success or forget (`Context::attempt`).
    attempts: HashMap<u32, u32>,
    /// The limiter's failure count per key.
    limiter: HashMap<u32, u32>,
    last_error: HashMap<u32, String>,
    /// Oldest first.
    parked: Vec<(u32, String)>,
    script: HashMap<u32, VecDeque<Res>>,
    calls: Vec<Call>,
    counts: Counts,
    global_last_error: Option<String>,
}

impl Model {
    fn push_ready(&mut self, k: u32, p: i32) {
        self.ready.retain(|&(_, _, r)| r != k);
        self.ready_seq += 1;
        self.ready.push((p, self.ready_seq, k));
        self.slots.insert(k, Slot::Ready(p));
    }

    /// A ready key's priority rises (P2): it moves to the back of its new
    /// priority, unless a batch holds it (then it keeps the place it took
    /// when it became ready: the engine's choice, the spec leaves it open).
    fn raise(&mut self, k: u32, p: i32) {
        if !self.batch {
            return self.push_ready(k, p);
        }
        let held = self.ready.iter_mut().find(|(_, _, r)| *r == k).expect("model: a ready key is in the ready list");
        held.0 = p;
        self.slots.insert(k, Slot::Ready(p));
    }

    fn add(&mut self, k: u32, p: i32) {
        if self.shutting_down {
            return;
        }
        match self.slots.get(&k).copied() {
            None => self.push_ready(k, p),
            Some(Slot::Delayed(_, _, old)) => self.push_ready(k, old.max(p)),
            Some(Slot::Ready(old)) if p > old => self.raise(k, p),
            Some(Slot::Ready(_)) => {}
            // With `supersede`, the run is cancelled and comes back with the
            // higher of its priority and the add's (U1).
            Some(Slot::Processing(Then::Finish, handed_out)) => {
                let again = if self.supersede { handed_out.max(p) } else { p };
                self.slots.insert(k, Slot::Processing(Then::Requeue, again));
                self.superseding |= self.supersede;
            }
            Some(Slot::Processing(Then::Wait(..), again)) => {
                self.slots.insert(k, Slot::Processing(Then::Requeue, again.max(p)));
                self.superseding |= self.supersede;
            }
            Some(Slot::Processing(Then::Requeue, again)) => {
                self.slots.insert(k, Slot::Processing(Then::Requeue, again.max(p)));
            }
        }
    }

    fn add_at(&mut self, k: u32, due: u64, p: i32) {
        if due <= self.now {
            return self.add(k, p);
        }
        if self.shutting_down {
            return;
        }
        let seq = self.seq + 1;
        let new = match self.slots.get(&k).copied() {
            None => Slot::Delayed(due, seq, p),
            Some(Slot::Delayed(old, _, q)) if due < old => Slot::Delayed(due, seq, q.max(p)),
            Some(Slot::Processing(Then::Finish, _)) => Slot::Processing(Then::Wait(due, seq), p),
            Some(Slot::Processing(Then::Wait(old, _), q)) if due < old => {
                Slot::Processing(Then::Wait(due, seq), q.max(p))
            }
            // The timing stays; the priority may still rise (P2).
            Some(Slot::Ready(old)) if p > old => return self.raise(k, p),
            Some(Slot::Delayed(t, q, old)) => Slot::Delayed(t, q, old.max(p)),
            Some(Slot::Processing(then, old)) => Slot::Processing(then, old.max(p)),
            Some(Slot::Ready(_)) => return,
        };
        // Only a new due time takes a sequence number.
        if matches!(new, Slot::Delayed(_, q, _) | Slot::Processing(Then::Wait(_, q), _) if q == seq) {
            self.seq = seq;
        }
        self.slots.insert(k, new);
    }

    fn add_after(&mut self, k: u32, d: u64, p: i32) {
        self.add_at(k, self.now + d, p);
    }

    fn advance(&mut self, d: u64) {
        self.now += d;
        let mut due: Vec<(u64, u64, u32)> = self
            .slots
            .iter()
            .filter_map(|(&k, s)| match *s {
                Slot::Delayed(t, q, _) | Slot::Processing(Then::Wait(t, q), _) if t <= self.now => Some((t, q, k)),
                _ => None,
            })
            .collect();
        due.sort_unstable();
        for (_, _, k) in due {
            match self.slots[&k] {
                Slot::Delayed(_, _, p) => self.push_ready(k, p),
                Slot::Processing(_, again) => {
                    self.slots.insert(k, Slot::Processing(Then::Requeue, again));
                    self.superseding |= self.supersede;
                }
                Slot::Ready(_) => unreachable!(),
            }
        }
    }

    /// Hands out the next key; returns it with its priority.
    fn take(&mut self) -> Option<(u32, i32)> {
        let best = (0..self.ready.len()).max_by_key(|&i| (self.ready[i].0, std::cmp::Reverse(self.ready[i].1)))?;
        let (p, _, k) = self.ready.remove(best);
        self.slots.insert(k, Slot::Processing(Then::Finish, p));
        self.parked.retain(|(q, _)| *q != k);
        Some((k, p))
    }

    fn done(&mut self, k: u32) {
        match self.slots.remove(&k) {
            Some(Slot::Processing(Then::Finish, _)) => {}
            Some(Slot::Processing(Then::Requeue, again)) => self.push_ready(k, again),
            Some(Slot::Processing(Then::Wait(t, q), again)) => {
                assert!(t > self.now, "model: a due wait is promoted before done");
                self.slots.insert(k, Slot::Delayed(t, q, again));
            }
            other => panic!("model: done({k}) while {other:?}"),
        }
    }

    fn forget(&mut self, k: u32) {
        self.attempts.remove(&k);
        self.last_error.remove(&k);
        self.limiter.remove(&k);
    }

    fn bump(&mut self, k: u32, error: Option<String>) {
        *self.attempts.entry(k).or_default() += 1;
        if let Some(e) = error {
            self.last_error.insert(k, e);
        }
    }

    /// `ExponentialBackoff(1 s, 1000 s)`: 1, 2, 4, ... capped at 1000.
    fn backoff(&mut self, k: u32) -> u64 {
        let n = self.limiter.entry(k).or_default();
        let d = if *n >= 10 { 1000 } else { (1u64 << *n).min(1000) };
        *n += 1;
        d
    }

    fn fail(&mut self, msg: String) {
        self.counts.failures += 1;
        self.global_last_error = Some(msg);
    }

    /// One reconcile of `k` (already taken at priority `p`), as guarantees §4's
    /// table says; every re-add keeps `p` (P3).
    fn reconcile(&mut self, k: u32, p: i32, cancelled: bool) {
        let attempt = self.attempts.get(&k).copied().unwrap_or(0);
        let res = self.script.get_mut(&k).and_then(VecDeque::pop_front).unwrap_or(Res::Done);
        let index = self.calls.len();
        let superseded = std::mem::take(&mut self.superseding);
        self.calls.push(Call { key: k, attempt, cancelled: cancelled || superseded, priority: p });
        if superseded {
            // Whatever it returned: neither success nor failure; attempt,
            // limiter, last error and parked keys stay as they were (U1).
            self.counts.superseded += 1;
            self.counts.reconciles += 1;
            return self.done(k);
        }
        match res {
            Res::Done => {
                self.forget(k);
                self.counts.successes += 1;
            }
            Res::Requeue => {
                self.bump(k, None);
                let d = self.backoff(k);
                self.add_after(k, d, p);
                self.counts.requeues += 1;
            }
            Res::RequeueAfter(d) => {
                // Work done, a resync asked for: a success.
                self.forget(k);
                self.add_after(k, d, p);
                self.counts.successes += 1;
            }
            Res::Fail | Res::Panic => {
                let kind = if res == Res::Fail { "fail" } else { "panic" };
                let msg = message(kind, k, index);
                self.bump(k, Some(msg.clone()));
                let d = self.backoff(k);
                self.add_after(k, d, p);
                if res == Res::Panic {
                    self.counts.panics += 1;
                }
                self.fail(msg);
            }
            Res::RetryAfter(d) => {
                let msg = message("retry", k, index);
                self.bump(k, Some(msg.clone()));
                self.add_after(k, d, p);
                self.fail(msg);
            }
            Res::Permanent => {
                let msg = message("perm", k, index);
                self.forget(k);
                self.parked.retain(|(p, _)| *p != k);
                self.parked.push((k, msg.clone()));
                self.fail(msg);
            }
        }
        // The result's own re-add supersedes nothing.
        self.superseding = false;
        self.counts.reconciles += 1;
        self.done(k);
    }

    /// The single worker, until nothing is ready.
    fn run(&mut self) {
        while let Some((k, p)) = self.take() {
            self.reconcile(k, p, false);
        }
    }

    /// Shutdown: delayed keys and pending waits go; with `discard`, ready
    /// keys too and the running key is not re-queued.
    fn shut_down(&mut self, discard: bool) {
        self.shutting_down = true;
        self.slots.retain(|_, s| !matches!(s, Slot::Delayed(..)));
        for s in self.slots.values_mut() {
            if let Slot::Processing(then, _) = s
                && (discard || matches!(then, Then::Wait(..)))
            {
                *then = Then::Finish;
            }
        }
        if discard {
            for (_, _, k) in self.ready.drain(..) {
                self.slots.remove(&k);
            }
        }
    }

    fn next_due(&self) -> Option<u64> {
        self.slots
            .values()
            .filter_map(|s| match *s {
                Slot::Delayed(t, _, _) | Slot::Processing(Then::Wait(t, _), _) => Some(t),
                _ => None,
            })
            .min()
    }

    fn waiting(&self) -> usize {
        self.slots.values().filter(|s| matches!(s, Slot::Delayed(..))).count()
    }
}

// ---------------------------------------------------------------------------
// Driving both

struct Harness {
    clock: FakeClock,
    t0: Instant,
    rec: Rec,
    h: ControllerHandle<u32>,
    m: Model,
}

/// Releases a gate and stops the controller even when a check fails, so a
/// failing case leaves no worker behind while proptest shrinks.
impl Drop for Harness {
    fn drop(&mut self) {
        self.rec.release();
        self.h.stop();
    }
}

impl Harness {
    fn new(supersede: bool) -> Self {
        let clock = FakeClock::new();
        let t0 = reconq::Clock::now(&clock);
        let rec = Rec::default();
        let h = Controller::new(NAME, rec.clone())
            .workers(1)
            .clock(clock.clone())
            .rate_limiter(ExponentialBackoff::new(secs(1), secs(1000)))
            .supersede(supersede)
            .start();
        Self { clock, t0, rec, h, m: Model { supersede, ..Model::default() } }
    }

    fn at(&self, t: u64) -> Instant {
        self.t0 + secs(t)
    }

    /// Applies an operation to both sides. Nothing here waits for the worker.
    fn apply(&mut self, op: &Inner) {
        match *op {
            Inner::Enqueue(k, p) => {
                self.h.enqueue_with_priority(k, p);
                self.m.add(k, p);
            }
            Inner::EnqueueAfter(k, d, p) => {
                self.h.enqueue_after_with_priority(k, secs(d), p);
                self.m.add_after(k, d, p);
            }
            Inner::EnqueueAt(k, off, p) => {
                let now = reconq::Clock::now(&self.clock);
                let at = if off >= 0 { now + secs(off as u64) } else { now - secs(off.unsigned_abs()) };
                self.h.enqueue_at_with_priority(k, at, p);
                // A past instant is now.
                self.m.add_at(k, self.m.now.saturating_add_signed(off.max(0)), p);
            }
            Inner::Advance(d) => {
                self.clock.advance(secs(d));
                self.m.advance(d);
            }
            Inner::AdvanceToNext => {
                let d = self.m.next_due().map_or(0, |t| t - self.m.now);
                self.clock.advance(secs(d));
                self.m.advance(d);
            }
            Inner::SetResults(k, ref r) => {
                self.rec.0.script.lock().entry(k).or_default().extend(r.iter().copied());
                self.m.script.entry(k).or_default().extend(r.iter().copied());
            }
            Inner::RequeueParked(k) => {
                let was = self.m.parked.iter().any(|(p, _)| *p == k);
                assert_eq!(self.h.requeue_parked(&k), was, "requeue_parked({k})");
                if was {
                    self.m.parked.retain(|(p, _)| *p != k);
                    self.m.add(k, 0);
                }
            }
            Inner::Cancel(k) => {
                let running = matches!(self.m.slots.get(&k), Some(Slot::Processing(..)));
                assert_eq!(self.h.cancel(&k), running, "cancel({k})");
            }
        }
    }

    /// Waits until nothing is ready or being processed. The fake clock does
    /// not move meanwhile, so that state lasts; adds and `done` are atomic
    /// with the hand-out of the next key, so it is never seen early.
    fn quiesce(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut spins = 0u32;
        loop {
            let s = self.h.stats();
            if s.depth == 0 && s.processing == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "controller never quiesced: {s:?}");
            spins += 1;
            if spins < 50 {
                thread::yield_now();
            } else {
                thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Runs the model's worker and checks every observable.
    fn settle_and_check(&mut self) {
        self.m.run();
        self.quiesce();
        self.check();
    }

    fn check(&self) {
        let m = &self.m;
        assert_eq!(*self.rec.0.calls.lock(), m.calls, "reconcile calls (key, attempt, cancelled), in order");
        let s = self.h.stats();
        let got = Counts {
            reconciles: s.reconciles,
            successes: s.successes,
            failures: s.failures,
            requeues: s.requeues,
            panics: s.panics,
            superseded: s.superseded,
        };
        assert_eq!(got, m.counts, "stats counters");
        assert_eq!((s.depth, s.processing, s.waiting), (0, 0, m.waiting()), "stats depth, processing, waiting");
        assert_eq!(s.parked, m.parked.len(), "stats parked");
        assert_eq!(s.last_error, m.global_last_error, "stats last_error");
        let parked: Vec<u32> = m.parked.iter().map(|(k, _)| *k).collect();
        assert_eq!(self.h.parked(), parked, "parked(), oldest first");
        for k in 0..KEYS {
            let parked_error = m.parked.iter().find(|(p, _)| *p == k).map(|(_, e)| e.clone());
            let attempts = m.attempts.get(&k).copied().unwrap_or(0);
            let memory_error = m.last_error.get(&k).cloned();
            let want = match m.slots.get(&k) {
                None => match parked_error {
                    Some(e) => KeyInfo { state: KeyStatus::Parked, attempts, last_error: Some(e), next_run: None },
                    None => KeyInfo { state: KeyStatus::Unknown, attempts, last_error: memory_error, next_run: None },
                },
                Some(&Slot::Delayed(t, _, _)) => KeyInfo {
                    state: KeyStatus::Waiting { until: self.at(t) },
                    attempts,
                    last_error: memory_error,
                    next_run: Some(self.at(t)),
                },
                Some(other) => panic!("model: key {k} is {other:?} at quiescence"),
            };
            assert_eq!(self.h.inspect(&k), want, "inspect({k})");
        }
    }

    /// Enqueues `k`, blocks its reconcile, and applies the batch meanwhile.
    /// Returns the priority it was handed out with (a delayed key keeps its
    /// own if higher).
    fn gate(&mut self, k: u32, batch: &[Inner]) -> i32 {
        assert!(self.m.ready.is_empty());
        self.rec.arm(k);
        self.h.enqueue(k);
        self.m.add(k, 0);
        let (taken, p) = self.m.take().expect("model: the gated key is ready");
        assert_eq!(taken, k, "model: the gated key is handed out first");
        self.rec.wait_entered();
        for op in batch {
            self.apply(op);
        }
        p
    }

    fn run_op(&mut self, op: &Op) {
        match op {
            Op::Do(inner) => self.apply(inner),
            Op::Gate(k, batch) => {
                let p = self.gate(*k, batch);
                self.rec.release();
                self.m.reconcile(*k, p, batch.iter().any(|o| matches!(o, Inner::Cancel(c) if c == k)));
            }
            Op::Batch(ops) => {
                let batch = self.h.batch();
                self.m.batch = true;
                for (op, elsewhere) in ops {
                    if *elsewhere {
                        // The harness moves to another thread and back.
                        thread::scope(|s| s.spawn(|| self.apply(op)).join().unwrap());
                    } else {
                        self.apply(op);
                    }
                }
                drop(batch);
                self.m.batch = false;
            }
        }
        self.settle_and_check();
    }

    fn finish(&mut self, end: &End) {
        match end {
            End::Stop => {
                self.h.stop();
                self.m.shut_down(true);
            }
            End::Drain => {
                assert!(self.h.stop_with_drain(PATIENCE), "idle drain finished");
                self.m.shut_down(false);
            }
            End::StopGated(k, batch) => {
                let p = self.gate(*k, batch);
                self.h.stop();
                self.m.shut_down(true);
                self.rec.release();
                self.m.reconcile(*k, p, true);
            }
            End::DrainGated(k, batch) => {
                let p = self.gate(*k, batch);
                let cancelled = batch.iter().any(|o| matches!(o, Inner::Cancel(c) if c == k));
                // A far-off key whose disappearance shows the drain began.
                self.h.enqueue_after(SENTINEL, secs(1_000_000));
                let h = self.h.clone();
                let drain = thread::spawn(move || h.stop_with_drain(PATIENCE));
                common::wait_for("the drain to drop delayed keys", || {
                    self.h.inspect(&SENTINEL).state == KeyStatus::Unknown
                });
                self.m.shut_down(false);
                self.rec.release();
                self.m.reconcile(*k, p, cancelled);
                assert!(drain.join().unwrap(), "drain finished in time");
            }
        }
        self.m.run();
        assert!(self.h.wait_stopped(Some(PATIENCE)), "controller stopped");
        self.check();
        // Enqueues after a stop are ignored, and time no longer matters.
        self.h.enqueue(0);
        self.h.enqueue_after(1, secs(1));
        self.clock.advance(secs(100_000));
        assert_eq!(self.h.stats().depth, 0);
        self.m.advance(100_000);
        self.check();
    }
}

/// Scripted panics on the controller's worker are expected: keep them out of
/// the test output (other panics still print).
fn quiet_worker_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let worker = thread::current().name().is_some_and(|n| n.starts_with(&format!("reconq-{NAME}-")));
            if !worker {
                previous(info);
            }
        }));
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn controller_matches_the_model(ops in prop::collection::vec(op(), 1..40), end in end(), supersede in any::<bool>()) {
        quiet_worker_panics();
        let mut harness = Harness::new(supersede);
        for op in &ops {
            harness.run_op(op);
        }
        harness.finish(&end);
    }
}

/// What the reconciles of `group_limits_hold_under_random_load` saw.
#[derive(Default)]
struct GroupLoad {
    in_flight: HashMap<u32, usize>,
    most: HashMap<u32, usize>,
    busy: HashMap<u32, bool>,
    /// Bumped before each enqueue, under this lock.
    version: HashMap<u32, u32>,
    /// The version the key's last started reconcile saw.
    seen: HashMap<u32, u32>,
    violations: Vec<String>,
}

const GROUPS: u32 = 3;

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    #[test]
    fn group_limits_hold_under_random_load(
        workers in 2..5usize,
        limit in 1..3usize,
        enqueues in prop::collection::vec((0..9u32, 0..3i32), 1..40),
        failures in prop::collection::vec(0..3u32, 9),
    ) {
        let load = Arc::new(Mutex::new(GroupLoad::default()));
        let seen_by_reconcile = Arc::clone(&load);
        let h = Controller::new("groups-model", move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
            let group = key % GROUPS;
            {
                let mut l = seen_by_reconcile.lock();
                let n = {
                    let n = l.in_flight.entry(group).or_default();
                    *n += 1;
                    *n
                };
                let most = l.most.entry(group).or_default();
                *most = (*most).max(n);
                if l.busy.insert(*key, true) == Some(true) {
                    l.violations.push(format!("G2: key {key} reconciled twice at once"));
                }
                let version = l.version.get(key).copied().unwrap_or(0);
                l.seen.insert(*key, version);
            }
            thread::yield_now();
            {
                let mut l = seen_by_reconcile.lock();
                *l.in_flight.get_mut(&group).unwrap() -= 1;
                l.busy.insert(*key, false);
            }
            match ctx.attempt() {
                a if a < failures[*key as usize] => Err(ReconcileError::new("not yet")),
                a if a == failures[*key as usize] && key.is_multiple_of(2) => Ok(Action::Requeue),
                _ => Ok(Action::Done),
            }
        })
        .workers(workers)
        .rate_limiter(ExponentialBackoff::new(Duration::ZERO, Duration::ZERO))
        .group(|key: &u32| key % GROUPS)
        .max_in_flight_per_group(limit)
        .start();
        for (key, priority) in enqueues {
            let mut l = load.lock();
            *l.version.entry(key).or_default() += 1;
            h.enqueue_with_priority(key, priority);
        }
        prop_assert!(h.wait_idle(PATIENCE), "a key was stranded: {:?}", h.stats());
        h.stop();
        let l = load.lock();
        prop_assert_eq!(&l.violations, &Vec::<String>::new());
        for (group, most) in &l.most {
            prop_assert!(*most <= limit, "P5: {} keys of group {} at once (limit {})", most, group, limit);
        }
        for (key, version) in &l.version {
            prop_assert_eq!(l.seen.get(key), Some(version), "G3: key {}'s last enqueue was never reconciled", key);
        }
    }
}

/// What the reconciles of `dependencies_hold_under_random_graphs` saw.
#[derive(Default)]
struct GraphLoad {
    running: Vec<u32>,
    /// ("start" | "end", key, cancelled at the end), in order.
    events: Vec<(&'static str, u32, bool)>,
    violations: Vec<String>,
}

/// `key`'s ancestors (`up`) or descendants (`down`) under `parents`.
fn reachable(parents: &[Vec<u32>], key: u32, up: bool) -> Vec<u32> {
    let next = |k: u32| -> Vec<u32> {
        if up {
            parents[k as usize].clone()
        } else {
            (0..parents.len() as u32).filter(|c| parents[*c as usize].contains(&k)).collect()
        }
    };
    let (mut out, mut stack) = (Vec::new(), next(key));
    while let Some(k) = stack.pop() {
        if !out.contains(&k) {
            out.push(k);
            stack.extend(next(k));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// Guarantees §14 under random graphs and load: several workers, a
    /// random DAG over 8 keys (edges from lower to higher keys, so no
    /// cycle), random enqueues at random priorities racing the reconciles,
    /// keys that fail or requeue a few times (retries continue a run) and
    /// end in success or a permanent error, with or without `supersede`,
    /// and with or without two groups of one key in flight each (a held
    /// key must not take its group's room). A cycle through any edge is
    /// refused. At every start, no ancestor and no descendant of the key
    /// runs (D1, D3's wait); once idle, each child's last run started after
    /// each parent's last run ended (D2, a permanent error included), every
    /// reconcile is counted once (success, failure, requeue or superseded),
    /// and nothing is left held.
    #[test]
    fn dependencies_hold_under_random_graphs(
        workers in 2..5usize,
        edges in prop::collection::vec((0..8u32, 0..8u32), 0..14),
        enqueues in prop::collection::vec((0..8u32, 0..3i32), 1..30),
        failures in prop::collection::vec(0..3u32, 8),
        permanent in prop::collection::vec(any::<bool>(), 8),
        supersede in any::<bool>(),
        grouped in any::<bool>(),
    ) {
        let mut parents: Vec<Vec<u32>> = vec![Vec::new(); 8];
        for (a, b) in edges {
            let (p, c) = (a.min(b), a.max(b));
            if p != c && !parents[c as usize].contains(&p) {
                parents[c as usize].push(p);
            }
        }
        let ancestors: Vec<Vec<u32>> = (0..8).map(|k| reachable(&parents, k, true)).collect();
        let descendants: Vec<Vec<u32>> = (0..8).map(|k| reachable(&parents, k, false)).collect();
        let load = Arc::new(Mutex::new(GraphLoad::default()));
        let seen = Arc::clone(&load);
        let (up, down) = (ancestors.clone(), descendants.clone());
        let controller = Controller::new("graph-model", move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
            {
                let mut l = seen.lock();
                let k = *key as usize;
                let clash: Vec<u32> =
                    l.running.iter().copied().filter(|r| r == key || up[k].contains(r) || down[k].contains(r)).collect();
                if !clash.is_empty() {
                    l.violations.push(format!("{key} started while {clash:?} ran"));
                }
                l.running.push(*key);
                l.events.push(("start", *key, false));
            }
            thread::yield_now();
            {
                let mut l = seen.lock();
                l.running.retain(|r| r != key);
                l.events.push(("end", *key, ctx.is_cancelled()));
            }
            match ctx.attempt() {
                a if a < failures[*key as usize] => Err(ReconcileError::new("not yet")),
                a if a == failures[*key as usize] && key.is_multiple_of(2) => Ok(Action::Requeue),
                _ if permanent[*key as usize] => Err(ReconcileError::permanent("given up")),
                _ => Ok(Action::Done),
            }
        })
        .workers(workers)
        .supersede(supersede)
        .rate_limiter(ExponentialBackoff::new(Duration::ZERO, Duration::ZERO));
        let controller = if grouped {
            controller.group(|key: &u32| key % 2).max_in_flight_per_group(1)
        } else {
            controller
        };
        let handle = controller.handle();
        for (child, ps) in parents.iter().enumerate() {
            handle.set_dependencies(&(child as u32), ps.iter().copied()).unwrap();
        }
        for (child, ps) in parents.iter().enumerate() {
            for p in ps {
                // Any edge closes a cycle the other way round.
                let Err(reconq::DependencyError::Cycle(err)) = handle.set_dependencies(p, [child as u32]) else {
                    panic!("a cycle")
                };
                prop_assert!(err.keys.contains(p) && err.keys.contains(&(child as u32)), "{:?}", err);
            }
            prop_assert_eq!(&handle.dependencies(&(child as u32)), ps);
        }
        let h = controller.start();
        for (key, priority) in enqueues {
            h.enqueue_with_priority(key, priority);
        }
        prop_assert!(h.wait_idle(PATIENCE), "a key was stranded: {:?}", h.stats());
        let stats = h.stats();
        h.stop();
        let l = load.lock();
        prop_assert_eq!(&l.violations, &Vec::<String>::new());
        let last = |what: &str, key: u32| l.events.iter().rposition(|e| e.0 == what && e.1 == key);
        for (child, ps) in parents.iter().enumerate() {
            for p in ps {
                if let Some(end) = last("end", *p) {
                    let start = last("start", child as u32);
                    prop_assert!(start > Some(end), "D2: {}'s last run did not follow {}'s: {:?}", child, p, l.events);
                }
            }
        }
        let starts = l.events.iter().filter(|e| e.0 == "start").count() as u64;
        prop_assert_eq!(stats.reconciles, starts);
        prop_assert_eq!(stats.successes + stats.failures + stats.requeues + stats.superseded, starts);
        prop_assert_eq!((stats.held, stats.depth, stats.processing), (0, 0, 0));
    }
}
