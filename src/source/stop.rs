//! The stop a source's list and stream are given: set once when their
//! cache stops. A source that waits on a timer waits on it
//! ([`Stop::wait_timeout`]); one blocked where it cannot look (a socket
//! read) registers a hook that unblocks it ([`Stop::on_set`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::context::StopSignal;
use crate::sync::{Condvar, Mutex};

type Hook = Box<dyn FnOnce() + Send>;

/// A flag set once, when the cache that uses a source stops. Clones share
/// it.
#[derive(Clone, Default)]
pub struct Stop {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    signal: StopSignal,
    hooks: Mutex<Hooks>,
}

#[derive(Default)]
struct Hooks {
    next_id: u64,
    waiting: Vec<(u64, Hook)>,
}

impl Stop {
    /// A stop that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether it is set.
    pub fn is_set(&self) -> bool {
        self.inner.signal.is_set()
    }

    /// Sets it, wakes every waiter and runs every hook (once, on this
    /// thread, with no lock held). Setting twice is harmless.
    pub fn set(&self) {
        // Set under the hooks' lock: a hook registered after this sees
        // the stop set and runs at once.
        let hooks = {
            let mut hooks = self.inner.hooks.lock();
            self.inner.signal.set();
            std::mem::take(&mut hooks.waiting)
        };
        for (_, hook) in hooks {
            hook();
        }
    }

    /// Blocks until it is set or `timeout` passes; returns whether it is
    /// set. An interruptible sleep.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.inner.signal.wait_timeout(timeout)
    }

    /// Blocks until `clock` reaches `until` or the stop is set; returns
    /// whether it is set. On a fake clock time moves only when the test
    /// advances it, so the wait is woken by each jump of the clock (and by
    /// the stop) instead of timing out: a period measured on a
    /// controller's clock (a watch's resync) follows its `FakeClock`.
    pub(crate) fn wait_until(&self, clock: &dyn Clock, until: Instant) -> bool {
        if clock.is_real_time() {
            return self.wait_timeout(until.saturating_duration_since(clock.now()));
        }
        let moved = Arc::new((Mutex::new(()), Condvar::new()));
        let wake: Arc<dyn Fn() + Send + Sync> = {
            let moved = Arc::clone(&moved);
            // Taking the lock orders the wake-up after the waiter's check
            // of the time: none is lost.
            Arc::new(move || {
                let _checked = moved.0.lock();
                moved.1.notify_all();
            })
        };
        clock.subscribe(Arc::downgrade(&wake));
        let _on_stop = self.on_set({
            let wake = Arc::clone(&wake);
            move || wake()
        });
        let mut checked = moved.0.lock();
        while clock.now() < until && !self.is_set() {
            moved.1.wait(&mut checked);
        }
        self.is_set()
    }

    /// Runs `hook` when the stop is set (at once, here, if it already
    /// is), unless the returned guard was dropped before: for a stream
    /// blocked in a read, `hook` closes what it reads from.
    pub fn on_set(&self, hook: impl FnOnce() + Send + 'static) -> StopHook {
        let mut hooks = self.inner.hooks.lock();
        if self.is_set() {
            drop(hooks);
            hook();
            return StopHook { stop: self.clone(), id: None };
        }
        let id = hooks.next_id;
        hooks.next_id += 1;
        hooks.waiting.push((id, Box::new(hook)));
        StopHook { stop: self.clone(), id: Some(id) }
    }
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop").field("set", &self.is_set()).finish()
    }
}

/// A hook registered with [`Stop::on_set`]; dropping it unregisters the
/// hook if it has not run.
#[must_use = "dropping the guard unregisters the hook"]
pub struct StopHook {
    stop: Stop,
    id: Option<u64>,
}

impl Drop for StopHook {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.stop.inner.hooks.lock().waiting.retain(|(hook, _)| *hook != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn hooks_run_once_when_set_and_not_after_their_guard_is_dropped() {
        let stop = Stop::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let counting = || {
            let runs = Arc::clone(&runs);
            move || {
                runs.fetch_add(1, Ordering::SeqCst);
            }
        };
        let _kept = stop.on_set(counting());
        drop(stop.on_set(counting()));
        assert!(!stop.wait_timeout(Duration::ZERO));
        stop.set();
        stop.set();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let _late = stop.on_set(counting());
        assert_eq!(runs.load(Ordering::SeqCst), 2, "a hook on a set stop runs at once");
        assert!(stop.wait_timeout(Duration::from_secs(60)));
    }
}
