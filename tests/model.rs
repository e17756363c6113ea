//! Property test: random operation sequences on a `WorkQueue` with a
//! `FakeClock` against an obviously-correct reference model (maps and a Vec),
//! comparing every observable after every step.
//!
//! The model promotes due keys eagerly, in (due time, scheduling order), the
//! moment the clock reaches them: that is what G4 ("FIFO by the time they
//! became ready") and G5 ("ready no earlier than d from now") say.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use reconq::{Clock, ExponentialBackoff, KeyState, QueueCounts, RateLimiter, WorkQueue};

const KEYS: u8 = 5;
const TICK: Duration = Duration::from_millis(10);
const BACKOFF_BASE: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(80);

#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    /// Delay in ticks (0 = now).
    AddAfter(u8, u8),
    TryGet,
    Done(u8),
    Forget(u8),
    AddRateLimited(u8),
    Advance(u8),
    ShutDown,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        3 => key.clone().prop_map(Op::Add),
        3 => (key.clone(), 0..6u8).prop_map(|(k, d)| Op::AddAfter(k, d)),
        4 => Just(Op::TryGet),
        3 => key.clone().prop_map(Op::Done),
        1 => key.clone().prop_map(Op::Forget),
        2 => key.prop_map(Op::AddRateLimited),
        2 => (1..5u8).prop_map(Op::Advance),
        1 => Just(Op::ShutDown),
    ]
}

/// A due time: (instant, scheduling sequence number) orders equal instants
/// first-in first-out.
type Due = (Instant, u64);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Ready,
    Delayed(Due),
    /// `then`: None = finish, Some(None) = ready again, Some(Some(due)) = wait.
    Processing(Option<Option<Due>>),
}

struct Model {
    now: Instant,
    seq: u64,
    slots: HashMap<u8, Slot>,
    ready: Vec<u8>,
    failures: HashMap<u8, u32>,
    shut_down: bool,
}

impl Model {
    fn new(now: Instant) -> Self {
        Self { now, seq: 0, slots: HashMap::new(), ready: Vec::new(), failures: HashMap::new(), shut_down: false }
    }

    fn add(&mut self, k: u8) {
        if self.shut_down {
            return;
        }
        match self.slots.get(&k).copied() {
            None | Some(Slot::Delayed(_)) => {
                self.slots.insert(k, Slot::Ready);
                self.ready.push(k);
            }
            Some(Slot::Processing(_)) => {
                self.slots.insert(k, Slot::Processing(Some(None)));
            }
            Some(Slot::Ready) => {}
        }
    }

    fn add_after(&mut self, k: u8, d: Duration) {
        if d.is_zero() || self.shut_down {
            return self.add(k);
        }
        self.seq += 1;
        let due = (self.now + d, self.seq);
        let slot = match self.slots.get(&k).copied() {
            None => Slot::Delayed(due),
            Some(Slot::Delayed(old)) if due.0 < old.0 => Slot::Delayed(due),
            Some(Slot::Processing(None)) => Slot::Processing(Some(Some(due))),
            Some(Slot::Processing(Some(Some(old)))) if due.0 < old.0 => Slot::Processing(Some(Some(due))),
            Some(_) => return,
        };
        self.slots.insert(k, slot);
    }

    fn add_rate_limited(&mut self, k: u8) {
        let n = self.failures.entry(k).or_default();
        let wait = BACKOFF_BASE.saturating_mul(1 << (*n).min(20)).min(BACKOFF_MAX);
        *n += 1;
        self.add_after(k, wait);
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        let mut due: Vec<(Due, u8)> = self
            .slots
            .iter()
            .filter_map(|(&k, s)| match s {
                Slot::Delayed(d) if d.0 <= self.now => Some((*d, k)),
                _ => None,
            })
            .collect();
        due.sort();
        for (_, k) in due {
            self.slots.insert(k, Slot::Ready);
            self.ready.push(k);
        }
        for slot in self.slots.values_mut() {
            if let Slot::Processing(Some(Some(d))) = slot
                && d.0 <= self.now
            {
                *slot = Slot::Processing(Some(None));
            }
        }
    }

    /// Ready keys stay; delayed keys and pending waits are dropped (G7).
    fn shut_down(&mut self) {
        self.shut_down = true;
        self.slots.retain(|_, s| !matches!(s, Slot::Delayed(_)));
        for slot in self.slots.values_mut() {
            if let Slot::Processing(Some(Some(_))) = slot {
                *slot = Slot::Processing(None);
            }
        }
    }

    fn try_get(&mut self) -> Option<u8> {
        if self.ready.is_empty() {
            return None;
        }
        let k = self.ready.remove(0);
        self.slots.insert(k, Slot::Processing(None));
        Some(k)
    }

    fn done(&mut self, k: u8) {
        match self.slots.get(&k).copied() {
            Some(Slot::Processing(None)) => {
                self.slots.remove(&k);
            }
            Some(Slot::Processing(Some(None))) => {
                self.slots.insert(k, Slot::Ready);
                self.ready.push(k);
            }
            Some(Slot::Processing(Some(Some(due)))) => {
                self.slots.insert(k, Slot::Delayed(due));
            }
            _ => {}
        }
    }

    fn counts(&self) -> QueueCounts {
        let count = |f: fn(&Slot) -> bool| self.slots.values().filter(|s| f(s)).count();
        QueueCounts {
            ready: self.ready.len(),
            processing: count(|s| matches!(s, Slot::Processing(_))),
            delayed: count(|s| matches!(s, Slot::Delayed(_))),
        }
    }

    fn key_state(&self, k: u8) -> KeyState {
        match self.slots.get(&k) {
            None => KeyState::Absent,
            Some(Slot::Ready) => KeyState::Ready,
            Some(Slot::Delayed(d)) => KeyState::Waiting { due: d.0 },
            Some(Slot::Processing(then)) => KeyState::Processing { again: then.map(|t| t.map(|d| d.0)) },
        }
    }
}

fn run(ops: &[(Op, bool)]) -> Result<(), TestCaseError> {
    let (q, clock): (WorkQueue<u8>, _) = common::fake_queue_with(ExponentialBackoff::new(BACKOFF_BASE, BACKOFF_MAX));
    // The model keeps its own failure counts and backoff arithmetic, so
    // num_requeues and the rate-limited due times are checked independently.
    let mut m = Model::new(clock.now());
    for (i, (op, observe)) in ops.iter().enumerate() {
        match *op {
            Op::Add(k) => {
                q.add(k);
                m.add(k);
            }
            Op::AddAfter(k, d) => {
                q.add_after(k, TICK * u32::from(d));
                m.add_after(k, TICK * u32::from(d));
            }
            Op::TryGet => {
                prop_assert_eq!(q.try_get(), m.try_get(), "step {}: {:?}", i, op);
            }
            Op::Done(k) => {
                q.done(&k);
                m.done(k);
            }
            Op::Forget(k) => {
                q.forget(&k);
                m.failures.remove(&k);
            }
            Op::AddRateLimited(k) => {
                q.add_rate_limited(k);
                m.add_rate_limited(k);
            }
            Op::ShutDown => {
                q.shut_down();
                m.shut_down();
            }
            Op::Advance(t) => {
                clock.advance(TICK * u32::from(t));
                m.advance(TICK * u32::from(t));
            }
        }
        // Observing promotes due keys, so some steps skip it: the queue must
        // behave the same whether or not anyone looked in between.
        if !observe {
            continue;
        }
        // key_state first: it must not depend on another call promoting.
        for k in 0..KEYS {
            prop_assert_eq!(q.key_state(&k), m.key_state(k), "step {}: {:?}, key {}", i, op, k);
            prop_assert_eq!(
                q.num_requeues(&k),
                m.failures.get(&k).copied().unwrap_or(0),
                "step {}: {:?}, key {}",
                i,
                op,
                k
            );
        }
        prop_assert_eq!(q.counts(), m.counts(), "step {}: {:?}", i, op);
        prop_assert_eq!(q.len(), m.ready.len(), "step {}: {:?}", i, op);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn queue_matches_reference_model(ops in prop::collection::vec((op(), any::<bool>()), 1..80)) {
        run(&ops)?;
    }
}

/// Sanity check of the model's own limiter arithmetic against the real one.
#[test]
fn model_backoff_matches_exponential_backoff() {
    let limiter = ExponentialBackoff::new(BACKOFF_BASE, BACKOFF_MAX);
    let mut m = Model::new(Instant::now());
    for _ in 0..8 {
        let before = m.now;
        let wait = limiter.when(&0u8);
        m.slots.clear();
        m.add_rate_limited(0);
        assert_eq!(m.key_state(0), KeyState::Waiting { due: before + wait });
    }
}
