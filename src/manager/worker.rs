//! One named controller: its state and the loop its thread runs.
//!
//! The thread sleeps on a condvar until its next run time (a timed wait on a
//! real clock; an untimed one woken by the clock's subscription on a fake
//! clock) or until an update, trigger or removal wakes it. A request to run is
//! one flag (`pending`), so any number of updates and triggers while a run is
//! in progress or before the thread wakes collapse into one run.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use super::params::ControllerParams;
use super::status::ControllerStatus;
use crate::clock::{Clock, deadline_after};
use crate::coordination::{LeaderSeat, Leading};
use crate::observe::fields::{Health, with_health};
use crate::sync::{Condvar, Mutex, MutexGuard};
use crate::{context::Context, context::StopSignal};
use crate::{logs, panics};

pub(crate) struct Ctl {
    name: String,
    /// The name of the manager this controller belongs to (for logs).
    manager: String,
    /// Log failures of `do` that returned an error (panics always are).
    log_errors: bool,
    state: Mutex<State>,
    wake: Condvar,
    clock: Arc<dyn Clock>,
    /// Keeps a fake clock's wake-up callback alive as long as the controller.
    _clock_subscription: Option<Arc<dyn Fn() + Send + Sync>>,
    /// With leader election: our use of it (the campaign runs while a
    /// controller of the manager lives, and a `do` of ours may run; losing
    /// leadership cancels the run in progress).
    leadership: Option<Box<dyn LeaderSeat>>,
    /// `State::removed`, readable without the state lock by a thread
    /// waiting for leadership under the election's lock.
    removing: AtomicBool,
}

struct State {
    params: ControllerParams,
    /// An update or trigger asked for a run.
    pending: bool,
    /// Removal asked: finish (after one run at least), run `stop`, exit.
    removed: bool,
    ran_once: bool,
    running: bool,
    /// The cancellation of the run in progress (set while `running`): an
    /// update or a removal cancels it.
    run_cancel: Option<StopSignal>,
    /// When the next run is due, or `None` to wait for an update or trigger.
    next_run: Option<Instant>,
    /// A success clears `last_error` (as Cilium does), except an exit's,
    /// which shows its reason there.
    health: Health,
    last_duration: Option<Duration>,
}

enum Outcome {
    Success,
    Exit(String),
    Failure(String),
}

impl Ctl {
    /// A controller whose first run is requested at once.
    pub(crate) fn new(
        name: String,
        manager: String,
        params: ControllerParams,
        clock: Arc<dyn Clock>,
        log_errors: bool,
        election: Option<&dyn Leading>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|weak: &Weak<Ctl>| {
            // Time jumps on a fake clock: wake the thread to re-check its due
            // time. The callback holds the controller weakly and the
            // controller holds the callback, so it lives as long as both.
            let clock_subscription = (!clock.is_real_time()).then(|| {
                let weak = weak.clone();
                let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                    if let Some(ctl) = weak.upgrade() {
                        // Taking the lock orders this wake-up after the
                        // thread's check of the time or its wait: no lost
                        // wake-up.
                        let _st = ctl.state.lock();
                        ctl.wake.notify_all();
                    }
                });
                clock.subscribe(Arc::downgrade(&wake));
                wake
            });
            let leadership = election.map(|election| {
                let weak = weak.clone();
                election.join(Box::new(move || {
                    if let Some(ctl) = weak.upgrade() {
                        cancel_run(&ctl.state.lock());
                    }
                }))
            });
            Ctl {
                name,
                manager,
                log_errors,
                state: Mutex::new(State {
                    params,
                    pending: true,
                    removed: false,
                    ran_once: false,
                    running: false,
                    run_cancel: None,
                    next_run: None,
                    health: Health::default(),
                    last_duration: None,
                }),
                wake: Condvar::new(),
                clock,
                _clock_subscription: clock_subscription,
                leadership,
                removing: AtomicBool::new(false),
            }
        })
    }

    /// Replaces the parameters (dropping the old `stop` unrun) and requests a
    /// run. A controller already removed refuses them (its thread may have
    /// taken its `stop` and exited), handing them back: the update then
    /// belongs to whatever now holds the name.
    pub(crate) fn update(&self, params: ControllerParams) -> Result<(), ControllerParams> {
        let old = {
            let mut st = self.state.lock();
            if st.removed {
                return Err(params);
            }
            let old = std::mem::replace(&mut st.params, params);
            st.pending = true;
            // The running `do` is the replaced one: cancel it.
            cancel_run(&st);
            self.wake.notify_all();
            old
        };
        // The old closures may own anything; drop them outside the lock.
        drop(old);
        Ok(())
    }

    pub(crate) fn trigger(&self) {
        let mut st = self.state.lock();
        st.pending = true;
        self.wake.notify_all();
    }

    pub(crate) fn remove(&self) {
        {
            let mut st = self.state.lock();
            st.removed = true;
            self.removing.store(true, Ordering::SeqCst);
            cancel_run(&st);
            self.wake.notify_all();
        }
        // A thread waiting for leadership looks again (not under our lock:
        // that thread checks `removing` under the election's).
        if let Some(leadership) = &self.leadership {
            leadership.wake();
        }
    }

    pub(crate) fn status(&self) -> ControllerStatus {
        let st = self.state.lock();
        let next_run_in = if st.running {
            None
        } else if st.pending {
            Some(Duration::ZERO)
        } else {
            st.next_run.map(|t| t.saturating_duration_since(self.clock.now()))
        };
        let (name, last_duration, running) = (self.name.clone(), st.last_duration, st.running);
        with_health!(ControllerStatus { name, last_duration, running, next_run_in }, st.health.clone())
    }

    /// The controller thread's body: runs `do` whenever due or requested
    /// until removed, then runs `stop` once.
    pub(crate) fn run(&self) {
        let mut st = self.state.lock();
        while self.wait_for_run(&mut st) {
            let fencing_token = match &self.leadership {
                None => None,
                Some(leadership) => match leadership.token() {
                    Some(token) => Some(token),
                    // A standby, removed: it never ran, so no `stop` either.
                    None if st.removed => break,
                    None => {
                        // The run stays due; look again once leading.
                        MutexGuard::unlocked(&mut st, || {
                            leadership.wait_token(&|| self.removing.load(Ordering::SeqCst));
                        });
                        continue;
                    }
                },
            };
            st.pending = false;
            st.running = true;
            st.next_run = None;
            let do_fn = Arc::clone(&st.params.do_fn);
            let cancel = StopSignal::new();
            st.run_cancel = Some(cancel.clone());
            let attempt = u32::try_from(st.health.consecutive_failures).unwrap_or(u32::MAX);
            let mut ctx = Context::with_signal(attempt, cancel);
            ctx.fencing_token = fencing_token;
            // For the failure log, as `record` will count it.
            let failures_if_failed = st.health.consecutive_failures + 1;
            let retry_if_failed = st.params.retry_delay(failures_if_failed);
            let (outcome, started, finished) = MutexGuard::unlocked(&mut st, || {
                let span = logs::manager_run_span(&self.manager, &self.name);
                let _entered = span.enter();
                let started = self.clock.now();
                let (outcome, panicked) = match catch_unwind(AssertUnwindSafe(|| do_fn(&ctx))) {
                    Ok(Ok(())) => (Outcome::Success, false),
                    Ok(Err(e)) => match e.exit_reason() {
                        Some(reason) => (Outcome::Exit(reason.to_owned()), false),
                        None => (Outcome::Failure(e.to_string()), false),
                    },
                    Err(panic) => (Outcome::Failure(panic_message(&*panic)), true),
                };
                drop(do_fn);
                let finished = self.clock.now();
                // Logged here, before the state lock is taken again (see
                // `crate::logs`).
                if let Outcome::Failure(message) = &outcome
                    && (panicked || self.log_errors)
                {
                    logs::manager_run_failed(
                        &self.manager,
                        &self.name,
                        failures_if_failed,
                        retry_if_failed,
                        message,
                        panicked,
                    );
                }
                (outcome, started, finished)
            });
            self.record(&mut st, outcome, started, finished);
        }
        // `stop` pairs with `do`: a standby that never ran skips both.
        let stop = if st.ran_once { st.params.stop_fn.take() } else { None };
        drop(st);
        if let Some(stop) = stop {
            // A panicking stop is logged; the thread ends anyway.
            if let Err(panic) = catch_unwind(AssertUnwindSafe(stop)) {
                logs::manager_stop_panicked(&self.manager, &self.name, &panic_message(&*panic));
            }
        }
    }

    /// Blocks until a run is due or requested (`true`) or the controller is
    /// removed after running at least once (`false`). A controller removed
    /// before its first run still runs once, as Cilium guarantees `stop` runs
    /// after `do`.
    fn wait_for_run(&self, st: &mut MutexGuard<'_, State>) -> bool {
        loop {
            if st.removed {
                return !st.ran_once;
            }
            if st.pending {
                return true;
            }
            match st.next_run {
                None => self.wake.wait(st),
                Some(due) => {
                    if self.clock.now() >= due {
                        return true;
                    }
                    if self.clock.is_real_time() {
                        self.wake.wait_until(st, due);
                    } else {
                        self.wake.wait(st);
                    }
                }
            }
        }
    }

    fn record(&self, st: &mut State, outcome: Outcome, started: Instant, finished: Instant) {
        let now = SystemTime::now();
        st.running = false;
        st.run_cancel = None;
        st.ran_once = true;
        st.last_duration = Some(finished.saturating_duration_since(started));
        let health = &mut st.health;
        let next = match outcome {
            Outcome::Success => {
                health.successes += 1;
                health.consecutive_failures = 0;
                health.last_error = None;
                health.last_error_time = None;
                health.last_success_time = Some(now);
                st.params.run_interval
            }
            Outcome::Exit(reason) => {
                // As Cilium: an exit is a success that shows its reason as
                // the last error, and parks the controller.
                health.successes += 1;
                health.consecutive_failures = 0;
                health.last_error = Some(reason);
                health.last_error_time = Some(now);
                health.last_success_time = Some(now);
                None
            }
            Outcome::Failure(message) => {
                health.failures += 1;
                health.consecutive_failures += 1;
                health.last_error = Some(message);
                health.last_error_time = Some(now);
                st.params.retry_delay(health.consecutive_failures)
            }
        };
        st.next_run = next.map(|delay| deadline_after(finished, delay));
    }
}

/// Cancels the run in progress, if any.
fn cancel_run(st: &State) {
    if let Some(cancel) = &st.run_cancel {
        cancel.set();
    }
}

/// A panic of `do` or `stop` as the manager reports it.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    format!("panicked: {}", panics::message(panic))
}
