//! Helpers shared by the controller tests.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reconq::*;

/// Generous: these only bound how long a broken test hangs.
pub const LONG: Duration = Duration::from_secs(20);

/// Waits for `cond` (polling, real time); panics with `what` after `LONG`.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What a scripted reconcile does on one call.
#[derive(Clone)]
pub enum Step {
    Done,
    Requeue,
    RequeueAfter(Duration),
    Fail(&'static str),
    RetryAfter(Duration, &'static str),
    Permanent(&'static str),
    Panic(&'static str),
}

/// A reconciler that plays a script (then `Done`) and records each call's
/// key and attempt.
#[derive(Clone, Default)]
pub struct Script {
    pub steps: Arc<Mutex<VecDeque<Step>>>,
    pub calls: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self { steps: Arc::new(Mutex::new(steps.into_iter().collect())), ..Default::default() }
    }

    pub fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().clone()
    }

    pub fn attempts(&self) -> Vec<u32> {
        self.calls.lock().iter().map(|c| c.1).collect()
    }

    pub fn ncalls(&self) -> usize {
        self.calls.lock().len()
    }
}

impl Reconciler<String> for Script {
    fn reconcile(&self, key: &String, ctx: &Context) -> Result<Action, ReconcileError> {
        self.calls.lock().push((key.clone(), ctx.attempt()));
        let step = self.steps.lock().pop_front().unwrap_or(Step::Done);
        match step {
            Step::Done => Ok(Action::Done),
            Step::Requeue => Ok(Action::Requeue),
            Step::RequeueAfter(d) => Ok(Action::RequeueAfter(d)),
            Step::Fail(m) => Err(m.into()),
            Step::RetryAfter(d, m) => Err(ReconcileError::retry_after(d, m)),
            Step::Permanent(m) => Err(ReconcileError::permanent(m)),
            Step::Panic(m) => panic!("{m}"),
        }
    }
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A controller on a fake clock with `ExponentialBackoff(1 s, 1000 s)`.
pub fn fake_controller(script: &Script, clock: &FakeClock) -> ControllerHandle<String> {
    Controller::new("test", script.clone())
        .clock(clock.clone())
        .rate_limiter(ExponentialBackoff::new(secs(1), secs(1000)))
        .start()
}
