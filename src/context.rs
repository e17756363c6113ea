//! What a reconcile sees besides its key: [`Context`], and the
//! [`StopSignal`] behind its cancellation (also given to triggers).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::sync::{AtomicBool, Condvar, Mutex};

/// A one-way flag threads can block on: set once, seen by everyone.
///
/// Cloning gives another handle to the same flag. Triggers receive one (set
/// when the trigger is removed, replaced or the controller stops), and every
/// reconcile's [`Context`] is backed by one.
#[derive(Clone, Default)]
pub struct StopSignal {
    inner: Arc<SignalInner>,
}

#[derive(Default)]
struct SignalInner {
    set: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl StopSignal {
    /// A signal that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the signal is set.
    pub fn is_set(&self) -> bool {
        self.inner.set.load(Ordering::Acquire)
    }

    /// Sets the signal and wakes every waiter. Setting twice is harmless.
    pub fn set(&self) {
        let _g = self.inner.lock.lock();
        self.inner.set.store(true, Ordering::Release);
        self.inner.cv.notify_all();
    }

    /// Blocks until the signal is set or `timeout` (real time) passes;
    /// returns whether it is set. An interruptible sleep:
    /// `if stop.wait_timeout(interval) { return }`.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut g = self.inner.lock.lock();
        while !self.is_set() {
            match deadline {
                Some(deadline) => {
                    if self.inner.cv.wait_until(&mut g, deadline).timed_out() {
                        break;
                    }
                }
                None => self.inner.cv.wait(&mut g),
            }
        }
        self.is_set()
    }

    /// Blocks until the signal is set.
    pub fn wait(&self) {
        let mut g = self.inner.lock.lock();
        while !self.is_set() {
            self.inner.cv.wait(&mut g);
        }
    }

    /// Wakes the threads blocked in [`wait_for`](Self::wait_for) to look at
    /// their condition again, without setting the signal (the other waits
    /// here treat it as a spurious wake-up). Lets a waiter block on "set, or
    /// something else happened" with one condition variable (the
    /// binding's wait for an async reconcile).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn notify(&self) {
        let _g = self.inner.lock.lock();
        self.inner.cv.notify_all();
    }

    /// Blocks until `ready()` holds. `ready` is checked under the signal's
    /// lock, which [`set`](Self::set) and [`notify`](Self::notify) take
    /// too: a condition made true before a `notify` is never missed.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn wait_for(&self, ready: impl Fn() -> bool) {
        let mut g = self.inner.lock.lock();
        while !ready() {
            self.inner.cv.wait(&mut g);
        }
    }

    /// Clears the flag (a worker reuses its signal for its next reconcile).
    pub(crate) fn reset_to(&self, set: bool) {
        if self.is_set() == set {
            return;
        }
        let _g = self.inner.lock.lock();
        self.inner.set.store(set, Ordering::Release);
    }
}

impl fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopSignal").field("set", &self.is_set()).finish()
    }
}

/// Per-reconcile information handed to the reconciler.
///
/// Valid for the duration of the call it is passed to.
pub struct Context {
    pub(crate) attempt: u32,
    pub(crate) signal: StopSignal,
    pub(crate) priority: i32,
    pub(crate) fencing_token: Option<u64>,
    /// The error of this key's previous failure since its last success, so
    /// a repeat of it is logged quietly (`logs::failure_loudness`).
    pub(crate) previous_error: Option<String>,
}

impl Context {
    /// A context not tied to any controller (never cancelled), for calling a
    /// reconciler directly in unit tests.
    pub fn detached(attempt: u32) -> Self {
        Self::with_signal(attempt, StopSignal::new())
    }

    /// A context at priority 0 with no fencing token, cancelled by `signal`.
    pub(crate) fn with_signal(attempt: u32, signal: StopSignal) -> Self {
        Self { attempt, signal, priority: 0, fencing_token: None, previous_error: None }
    }

    /// The priority the key was handed out with (guarantees §8): retries re-add it
    /// with this priority.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// The fencing token of the leadership this reconcile runs under: pass
    /// it to writes so a deposed leader's late writes can be refused. `None`
    /// without [leader election](crate::LeaderElection).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Tries of this key since its last success or forget: 0 on the first
    /// try, 1 on the first retry, and so on. `Ok(Done)`,
    /// `Ok(RequeueAfter(_))` and permanent errors reset it; errors, panics,
    /// `retry_after` errors and `Ok(Requeue)` add one.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the controller wants this reconcile to end early: it is
    /// stopping (at once, or a drain's deadline passed),
    /// [`ControllerHandle::cancel`](super::ControllerHandle::cancel) was
    /// called for this key, or its [`timeout`](super::Controller::timeout)
    /// passed. Cancellation is cooperative: check it in long
    /// loops, or block with [`wait_cancelled`](Self::wait_cancelled).
    pub fn is_cancelled(&self) -> bool {
        self.signal.is_set()
    }

    /// Blocks until this reconcile is cancelled or `timeout` (real time)
    /// passes; returns whether it was cancelled. Use it as an interruptible
    /// sleep.
    pub fn wait_cancelled(&self, timeout: Duration) -> bool {
        self.signal.wait_timeout(timeout)
    }

    /// The signal behind [`is_cancelled`](Self::is_cancelled).
    pub fn cancel_signal(&self) -> &StopSignal {
        &self.signal
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("attempt", &self.attempt)
            .field("priority", &self.priority)
            .field("cancelled", &self.is_cancelled())
            .field("fencing_token", &self.fencing_token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::StopSignal;

    /// The wait of an `async def` reconcile's worker (python `awaiting`):
    /// woken by `notify` for its own condition, which leaves the signal
    /// unset, or by `set`.
    #[test]
    fn wait_for_wakes_on_notify_without_setting_the_signal_and_on_set() {
        let signal = StopSignal::new();
        let done = Arc::new(AtomicBool::new(false));
        let notifier = {
            let (signal, done) = (signal.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                done.store(true, Ordering::Release);
                signal.notify();
            })
        };
        signal.wait_for(|| done.load(Ordering::Acquire) || signal.is_set());
        notifier.join().unwrap();
        assert!(!signal.is_set());

        let setter = {
            let signal = signal.clone();
            std::thread::spawn(move || signal.set())
        };
        signal.wait_for(|| signal.is_set());
        setter.join().unwrap();
    }
}
